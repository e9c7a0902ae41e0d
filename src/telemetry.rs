//! The binary's logs and, with the `otel` feature, its traces: log lines go to stderr (text or
//! JSON) and carry `trace_id`/`span_id` inside a traced span; spans are exported over OTLP/HTTP
//! when `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set.

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

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
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    layers.push(match format {
        LogFormat::Text => fmt
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
        let endpoint = env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
            .or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"))
            .is_some();
        let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
            || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.eq_ignore_ascii_case("none"));
        if !endpoint || disabled {
            return Ok(None);
        }
        for var in [
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ] {
            if let Some(protocol) = env(var) {
                if protocol != "http/protobuf" {
                    return Err(format!(
                        "{var}: {protocol:?} is not supported; outbox-relay exports OTLP over http/protobuf"
                    ));
                }
                break;
            }
        }
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
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
