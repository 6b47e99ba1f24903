package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// decisions reads the decisions stream: how many records it holds and the
// first denial's record.
func decisions(ctx context.Context, natsURL, stream string, opts []nats.Option) (records int, denial string, err error) {
	nc, err := nats.Connect(natsURL, opts...)
	if err != nil {
		return 0, "", err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, "", err
	}
	cons, err := js.OrderedConsumer(ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		return 0, "", err
	}
	for {
		batch, err := cons.Fetch(256, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			return 0, "", err
		}
		n := 0
		for m := range batch.Messages() {
			n++
			var recs []struct {
				Data json.RawMessage `json:"data"`
			}
			if err := json.Unmarshal(m.Data(), &recs); err != nil {
				return 0, "", err
			}
			for _, r := range recs {
				records++
				if denial == "" && strings.Contains(string(r.Data), `"allowed":false`) {
					denial = string(r.Data)
				}
			}
		}
		if n == 0 {
			return records, denial, nil
		}
	}
}

// span is what the console exporter writes of a span (one JSON line).
type span struct {
	Name        string
	SpanKind    int
	SpanContext struct{ TraceID string }
}

// aTrace finds, in a log the console span exporter wrote to, the trace
// with the most spans (a request whose accounting event was published has
// its server span and the publish's) and returns its id and span names.
func aTrace(logPath string) (string, []string, error) {
	f, err := os.Open(logPath)
	if err != nil {
		return "", nil, err
	}
	defer f.Close()
	byTrace := map[string][]string{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var s span
		if json.Unmarshal(sc.Bytes(), &s) != nil || s.Name == "" || s.SpanContext.TraceID == "" {
			continue // a log line, not a span
		}
		byTrace[s.SpanContext.TraceID] = append(byTrace[s.SpanContext.TraceID], s.Name)
	}
	best := ""
	for id, names := range byTrace {
		if best == "" || len(names) > len(byTrace[best]) || (len(names) == len(byTrace[best]) && id < best) {
			best = id
		}
	}
	if best == "" {
		return "", nil, fmt.Errorf("no span in %s", logPath)
	}
	return best, byTrace[best], nil
}
