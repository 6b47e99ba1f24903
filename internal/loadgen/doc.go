// Package loadgen is a small HTTP/1.1 load generator for servers on the
// local machine, together with the latency histogram and the SVG line
// charts used to report what it measures.
//
// It is meant to share a few CPU cores with the servers it drives, so it
// does as little as it can per request: it writes pre-built raw requests on
// keep-alive TCP connections and reads the responses with a hand-written
// parser, without net/http's client, and without allocating on the hot path.
//
// # Closed and open loop
//
// [ClosedLoop] runs a fixed number of connections, each sending a request
// and waiting for its response before sending the next. It measures the
// throughput the server sustains at that concurrency, and latency from the
// write of each request to the end of its response.
//
// [OpenLoop] sends requests on a fixed schedule, evenly spaced at a given
// rate, whatever the server does. A request whose scheduled time comes while
// every connection is busy waits for one, and latency is measured from the
// scheduled time, not from the write, so the time a slow server makes
// requests queue counts in the latencies it is charged with (there is no
// coordinated omission).
//
// Both dial all their connections before they start, then run a warm-up that
// is not counted, then the measured period.
//
// # Requests and responses
//
// A [Target] names the server address and returns the raw bytes of each
// request. Responses are framed by Content-Length, by chunked transfer
// encoding, or by the server closing the connection; a response that asks
// for the connection to be closed ("Connection: close", or HTTP/1.0 without
// keep-alive) makes the connection be dialled again before the next request.
// Status codes are counted; bodies are discarded. A connection whose
// response cannot be read or parsed is closed, counted as an error and
// dialled again, and a failed dial is retried every 10 ms until the run ends.
//
// # Reporting
//
// [Histogram] records durations in log-linear buckets with a relative error
// below 1% from 1µs to over 100s. [Chart.WriteSVG] draws series of points as
// a standalone SVG line chart, optionally with a logarithmic Y axis.
package loadgen
