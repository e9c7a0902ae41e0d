//! Values that must not be printed as they are: connection strings, NATS URLs, passwords.

use std::fmt;

use super::nats::redacted_nats_url;

/// A string that must not be printed as it is: `Debug` shows it through `$debug` (a redacted
/// form), `expose()` gives the value to the one place that uses it.
macro_rules! hidden_string {
    ($(#[$doc:meta])* $name:ident, $expose:literal, $debug:expr) => {
        $(#[$doc])*
        #[derive(Clone, Default, PartialEq, Eq)]
        pub struct $name(String);

        impl $name {
            #[doc = $expose]
            pub fn expose(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                let debug: fn(&str, &mut fmt::Formatter<'_>) -> fmt::Result = $debug;
                debug(&self.0, f)
            }
        }

        impl<S: Into<String>> From<S> for $name {
            fn from(value: S) -> Self {
                $name(value.into())
            }
        }
    };
}

hidden_string!(
    /// A libpq connection string (URL or key=value). `Debug` shows its parsed parameters with the
    /// password replaced; [`DatabaseUrl::expose`] gives the string itself, for connecting.
    DatabaseUrl,
    "The connection string as given (with its password).",
    |url, f| fmt::Debug::fmt(&crate::db::redacted_url(url), f)
);

hidden_string!(
    /// NATS server URLs, comma-separated (credentials in them are taken out and sent in the
    /// connect options). `Debug` shows them with a password or token replaced.
    NatsUrl,
    "The URLs as given (with their credentials).",
    |urls, f| fmt::Debug::fmt(&redacted_nats_url(urls), f)
);

hidden_string!(
    /// A password or token: `Debug` shows `***`, never the value.
    Secret,
    "The secret itself, for the one place that sends it.",
    |_, f| f.write_str(crate::db::conninfo::HIDDEN)
);
