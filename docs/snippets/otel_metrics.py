# OpenTelemetry metrics: the application sets up the SDK (its meter provider, a reader, an
# exporter) where its tasks are declared, and `pgjobs work --otel-metrics` records through it.
# Here the exporter prints to stdout every minute, and once more at exit; in production it would
# be OTLPMetricExporter (package opentelemetry-exporter-otlp) sending to a collector.
# tests/integration/docs/test_doc_snippets.py runs this file with `pgjobs work`.
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

import pgjobs

reader = PeriodicExportingMetricReader(ConsoleMetricExporter(), export_interval_millis=60_000)
metrics.set_meter_provider(
    MeterProvider(
        metric_readers=[reader],
        resource=Resource.create({"service.name": "billing-worker"}),
    )
)

app = pgjobs.App()


@app.task(name="billing.invoice", queue="billing")
def invoice(order_id: int) -> None:
    print(f"invoice for order {order_id}")
