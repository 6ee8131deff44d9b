package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Traces are opt-in and configured by OpenTelemetry's own variables, as
// every OTLP exporter is: OTEL_EXPORTER_OTLP_ENDPOINT (or _TRACES_ENDPOINT)
// turns them on; OTEL_EXPORTER_OTLP_PROTOCOL chooses http/protobuf (the
// default) or grpc; OTEL_EXPORTER_OTLP_HEADERS, _TIMEOUT, _INSECURE,
// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER and
// OTEL_BSP_* mean what the specification says. OTEL_SDK_DISABLED=true or
// OTEL_TRACES_EXPORTER=none turns them off.

// startTracing returns the tracer the server gives each call a span with,
// and the function that flushes and stops the exporter; a nil tracer when
// the environment does not ask for traces.
func startTracing(ctx context.Context, getenv func(string) (string, bool), log *slog.Logger) (trace.Tracer, func(context.Context) error, error) {
	get := func(k string) string { v, _ := getenv(k); return strings.TrimSpace(v) }
	none := func(context.Context) error { return nil }
	if strings.EqualFold(get("OTEL_SDK_DISABLED"), "true") || get("OTEL_TRACES_EXPORTER") == "none" {
		return nil, none, nil
	}
	if get("OTEL_EXPORTER_OTLP_ENDPOINT") == "" && get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") == "" {
		return nil, none, nil
	}
	protoVar, proto := "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		protoVar, proto = "OTEL_EXPORTER_OTLP_PROTOCOL", get("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	var client otlptrace.Client
	switch proto {
	case "", "http/protobuf":
		proto, client = "http/protobuf", otlptracehttp.NewClient()
	case "grpc":
		client = otlptracegrpc.NewClient()
	default:
		return nil, nil, fmt.Errorf("%s=%s: mcp-exec exports traces over http/protobuf or grpc", protoVar, proto)
	}
	// The exporter connects lazily: a collector that is down costs spans,
	// never the server's start.
	exp, err := otlptrace.New(ctx, client)
	if err != nil {
		return nil, nil, fmt.Errorf("starting the OTLP trace exporter: %w", err)
	}
	// The service's name and version first, so that OTEL_SERVICE_NAME and
	// OTEL_RESOURCE_ATTRIBUTES override them.
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", "mcp-exec"), attribute.String("service.version", version)),
		resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, nil, fmt.Errorf("OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	// The exporter's failures (a collector down) are the operator's, in
	// the server's log rather than on a stderr of their own.
	otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("exporting traces", "err", err) }))
	endpoint := get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if endpoint == "" {
		endpoint = get("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	log.Info("tracing", "endpoint", endpoint, "protocol", proto)
	return tp.Tracer("github.com/inhuman/mcp-exec"), tp.Shutdown, nil
}
