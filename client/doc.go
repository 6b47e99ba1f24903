// Package client is what a service needs to work with Tally from Go: the
// key contract (identities, window digests and shard placement, as
// docs/keys.md specifies them), a Publisher of accounting events (charges
// and refunds of requests the service decides itself, numbered as a
// producer so that each is applied once), a DecisionClient for the
// decision API (ask before serving a request, report how it finished), and
// Follow, which reads the decisions stream.
//
// It is the one part of Tally meant to be imported. Everything it puts on
// the wire is docs/events.md's and docs/keys.md's contract, so a service in
// another language can do the same without it (examples/python checks a
// second implementation of the key contract against the same test
// vectors).
//
// A service that decides itself and lets Tally count:
//
//	keys, _ := client.NewKeys("tally", secret, []string{"s0", "s1"})
//	pub, _ := client.NewPublisher(js, client.PublisherConfig{Namespace: "billing", Source: "billing-api", Keys: keys})
//	r, err := pub.Charge(ctx, client.Charge{Policy: "core", Limit: 5000, Window: time.Hour,
//		Identity: client.HeaderIdentity("Authorization", token)})
//	...
//	_, err = pub.Finish(ctx, r, http.StatusNotModified) // a 304 gives the charge back
//
// A service that asks first:
//
//	api := client.NewDecisionClient("http://127.0.0.1:8081", apiToken, nil)
//	d, err := api.Check(ctx, client.CheckRequest{Policy: "core", Identity: userID})
//	if err == nil && !d.Allowed { /* answer 429, Retry-After: d.RetryAfter */ }
//
// examples/service is a runnable program that does both and follows the
// decisions stream.
package client
