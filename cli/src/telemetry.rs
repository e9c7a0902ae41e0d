//! The binary's logs and, with the `otel` feature, its traces: log lines go to stderr (text or
//! JSON) and carry `trace_id`/`span_id` inside a traced span; spans are exported over OTLP/HTTP
//! when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::field::MakeExt;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use outbox_relay::text::OneLine;

use crate::cli::LogFormat;

/// What has to be shut down at exit (the span exporter, flushing what it holds).
pub struct Telemetry {
    #[cfg(feature = "otel")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Telemetry {
    /// Flushes and stops the span exporter, if any. Call it outside the async runtime.
    pub fn shutdown(self) {
        #[cfg(feature = "otel")]
        if let Some(provider) = self.provider {
            if let Err(e) = provider.shutdown() {
                tracing::warn!(error = %e, "flushing the spans at exit failed");
            }
        }
    }
}

type BoxedLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Installs the global subscriber; with `traces` (the `run` command) and an OTLP endpoint in the
/// environment, also the span exporter. An error names the environment variable at fault.
pub fn init(format: LogFormat, traces: bool) -> Result<Telemetry, String> {
    let mut layers: Vec<BoxedLayer> = Vec::new();
    let mut filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,tokio_postgres=warn"));
    // The relay's send spans are for the tracer, not for the log lines (which get the trace ids
    // instead); left to a subscriber without a tracer they would only cost.
    if let Ok(directive) = "outbox_relay::otel=off".parse() {
        filter = filter.add_directive(directive);
    }
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(colours(
            std::io::IsTerminal::is_terminal(&std::io::stderr()),
            std::env::var_os("NO_COLOR"),
        ));
    layers.push(match format {
        LogFormat::Text => fmt
            .fmt_fields(escaped_fields())
            .event_format(WithTraceIds {
                inner: tracing_subscriber::fmt::format(),
                json: false,
            })
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => fmt
            .json()
            .event_format(WithTraceIds {
                inner: tracing_subscriber::fmt::format().json().flatten_event(true),
                json: true,
            })
            .with_filter(filter)
            .boxed(),
    });
    #[cfg(feature = "otel")]
    let provider = {
        opentelemetry::global::set_text_map_propagator(
            opentelemetry_sdk::propagation::TraceContextPropagator::new(),
        );
        let provider = if traces { otlp::provider()? } else { None };
        if let Some(provider) = &provider {
            layers.push(otlp::layer(provider));
        }
        provider
    };
    #[cfg(not(feature = "otel"))]
    let _ = traces;
    tracing_subscriber::registry().with(layers).init();
    Ok(Telemetry {
        #[cfg(feature = "otel")]
        provider,
    })
}

#[cfg(feature = "otel")]
mod otlp {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry::InstrumentationScope;
    use opentelemetry_otlp::WithHttpConfig as _;
    use opentelemetry_sdk::trace::SdkTracerProvider;
    use opentelemetry_sdk::Resource;
    use tracing_subscriber::filter::Targets;
    use tracing_subscriber::Layer;

    use super::BoxedLayer;

    fn env(name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.trim().is_empty())
    }

    /// An SDK tracer provider with a batch OTLP/HTTP exporter when an endpoint is configured
    /// (and neither `OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none`). The exporter, the
    /// batch processor, the sampler and the resource read the other standard `OTEL_*` variables
    /// themselves.
    pub(super) fn provider() -> Result<Option<SdkTracerProvider>, String> {
        let endpoint = signal_env(
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
        )
        .is_some();
        let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
        if !endpoint || disabled {
            return Ok(None);
        }
        if let Some((var, protocol)) = signal_env(
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ) {
            if protocol != "http/protobuf" {
                return Err(format!(
                    "{var}: {protocol:?} is not supported; outbox-relay exports OTLP over http/protobuf"
                ));
            }
        }
        // reqwest's rustls takes the process's provider: the one the relay uses everywhere.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut exporter = opentelemetry_otlp::SpanExporter::builder().with_http();
        if let Some(client) = tls_client()? {
            exporter = exporter.with_http_client(client);
        }
        let exporter = exporter
            .build()
            .map_err(|e| format!("OTEL_EXPORTER_OTLP_ENDPOINT: {e}"))?;
        let named = env("OTEL_SERVICE_NAME").is_some()
            || env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| {
                a.split(',')
                    .any(|kv| kv.trim().starts_with("service.name="))
            });
        let mut resource = Resource::builder();
        if !named {
            resource = resource.with_service_name("outbox-relay");
        }
        Ok(Some(
            SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(resource.build())
                .build(),
        ))
    }

    /// The traces variable or, without it, the general one (as the OpenTelemetry SDKs read them).
    fn signal_env(traces: &'static str, general: &'static str) -> Option<(&'static str, String)> {
        env(traces)
            .map(|v| (traces, v))
            .or_else(|| env(general).map(|v| (general, v)))
    }

    fn read_pem(var: &str, path: &str) -> Result<Vec<u8>, String> {
        std::fs::read(path).map_err(|e| format!("{var}: cannot read {path}: {e}"))
    }

    /// The exporter's HTTP client when the standard TLS variables ask for more than the system's
    /// roots: `OTEL_EXPORTER_OTLP_[TRACES_]CERTIFICATE` (PEM roots trusted besides the system's)
    /// and `OTEL_EXPORTER_OTLP_[TRACES_]CLIENT_CERTIFICATE` with `..._CLIENT_KEY` (mutual TLS).
    /// `None`: the exporter's own client (which verifies against the system's roots). Built here,
    /// before the runtime starts, as a blocking client must be.
    fn tls_client() -> Result<Option<reqwest::blocking::Client>, String> {
        let roots = signal_env(
            "OTEL_EXPORTER_OTLP_TRACES_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CERTIFICATE",
        );
        let cert = signal_env(
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE",
            "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE",
        );
        let key = signal_env(
            "OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY",
            "OTEL_EXPORTER_OTLP_CLIENT_KEY",
        );
        if roots.is_none() && cert.is_none() && key.is_none() {
            return Ok(None);
        }
        let mut builder = reqwest::blocking::Client::builder().timeout(export_timeout()?);
        if let Some((var, path)) = roots {
            let certs = reqwest::Certificate::from_pem_bundle(&read_pem(var, &path)?)
                .map_err(|e| format!("{var}: {path} holds no PEM certificate: {e}"))?;
            if certs.is_empty() {
                return Err(format!("{var}: {path} holds no PEM certificate"));
            }
            builder = builder.tls_certs_merge(certs);
        }
        match (cert, key) {
            (Some((cert_var, cert_path)), Some((key_var, key_path))) => {
                let mut pem = read_pem(cert_var, &cert_path)?;
                pem.push(b'\n');
                pem.extend(read_pem(key_var, &key_path)?);
                let identity = reqwest::Identity::from_pem(&pem).map_err(|e| {
                    format!("{cert_var} and {key_var}: no certificate and private key in PEM: {e}")
                })?;
                builder = builder.identity(identity);
            }
            (Some((var, _)), None) | (None, Some((var, _))) => {
                return Err(format!(
                    "{var} needs its pair: a client certificate takes both \
                     OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and OTEL_EXPORTER_OTLP_CLIENT_KEY"
                ));
            }
            (None, None) => {}
        }
        builder
            .build()
            .map(Some)
            .map_err(|e| format!("OTLP exporter TLS: {e}"))
    }

    /// `OTEL_EXPORTER_OTLP_[TRACES_]TIMEOUT` in milliseconds, 10 s without it (the exporter's own
    /// default, which applies to its own client only).
    fn export_timeout() -> Result<std::time::Duration, String> {
        match signal_env(
            "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ) {
            None => Ok(std::time::Duration::from_secs(10)),
            Some((var, ms)) => ms
                .trim()
                .parse::<u64>()
                .map(std::time::Duration::from_millis)
                .map_err(|_| format!("{var}: {ms:?} is no number of milliseconds")),
        }
    }

    /// The layer that turns the relay's `tracing` spans into OpenTelemetry spans. It sees the
    /// relay's spans and, as span events, its log lines from info up, whatever `RUST_LOG` lets
    /// through to the log.
    pub(super) fn layer(provider: &SdkTracerProvider) -> BoxedLayer {
        opentelemetry::global::set_tracer_provider(provider.clone());
        let scope = InstrumentationScope::builder("outbox-relay")
            .with_version(env!("CARGO_PKG_VERSION"))
            .build();
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer_with_scope(scope))
            .with_location(false)
            .with_threads(false)
            .with_level(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            .with_filter(Targets::new().with_target("outbox_relay", tracing::Level::INFO))
            .boxed()
    }
}

/// An event format that appends `trace_id` and `span_id` of the current span's OpenTelemetry
/// context to each line (as fields of the JSON object, or as `key=value` at the end of a text
/// line). Lines outside a traced span are written as `inner` writes them.
/// Colours in the text log only on a terminal, and not with `NO_COLOR` set to anything but the
/// empty string (no-color.org): in a file, a pipe or journald they are noise in every line.
fn colours(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// The text log's fields, each value with its control and hidden format characters escaped
/// ([`OneLine`]): values come from rows (aggregate ids, event types, error texts naming them), and
/// a raw newline would let a row forge a log line, an escape sequence reach the operator's
/// terminal. Names are in italics and `=` dimmed on a terminal, as the default fields are.
fn escaped_fields() -> impl for<'w> FormatFields<'w> + Send + Sync + 'static {
    tracing_subscriber::fmt::format::debug_fn(
        |writer: &mut Writer<'_>, field: &tracing::field::Field, value: &dyn fmt::Debug| {
            let value = format!("{value:?}");
            let value = OneLine(&value);
            match field.name() {
                "message" => write!(writer, "{value}"),
                name if writer.has_ansi_escapes() => {
                    write!(writer, "\x1b[3m{name}\x1b[0m\x1b[2m=\x1b[0m{value}")
                }
                name => write!(writer, "{name}={value}"),
            }
        },
    )
    .delimited(" ")
}

struct WithTraceIds<F> {
    inner: F,
    json: bool,
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some((trace_id, span_id)) = current_trace_ids() else {
            return self.inner.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        let body = line.strip_suffix('\n').unwrap_or(&line);
        match body.strip_suffix('}') {
            Some(object) if self.json => writeln!(
                writer,
                "{object},\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\"}}"
            ),
            _ => writeln!(writer, "{body} trace_id={trace_id} span_id={span_id}"),
        }
    }
}

/// Trace and span id (lowercase hex) of the current span, when it has a valid OpenTelemetry
/// context.
#[cfg(feature = "otel")]
fn current_trace_ids() -> Option<(String, String)> {
    use opentelemetry::trace::TraceContextExt;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    let span = tracing::Span::current();
    if span.is_none() {
        return None;
    }
    let cx = span.context();
    let otel_span = cx.span();
    let sc = otel_span.span_context();
    sc.is_valid()
        .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}

#[cfg(not(feature = "otel"))]
fn current_trace_ids() -> Option<(String, String)> {
    None
}

#[cfg(test)]
mod log_text_tests {
    use super::colours;

    #[test]
    fn colours_on_a_terminal_unless_no_color() {
        assert!(!colours(false, None));
        assert!(colours(true, None));
        assert!(!colours(true, Some("1".into())));
        assert!(!colours(false, Some("1".into())));
        assert!(
            colours(true, Some("".into())),
            "NO_COLOR empty counts as unset"
        );
    }
}
