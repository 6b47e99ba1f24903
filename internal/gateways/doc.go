// Package gateways tests Tally behind real gateways: nginx (auth_request)
// and Caddy (forward_auth), from Debian's packages, each started on free
// loopback ports with the example configuration Tally ships (deploy/nginx,
// deploy/caddy) and stopped after. A limit of N admits exactly N per window
// through each; the client sees the rate-limit headers and Retry-After;
// 304s are given back from the gateway's access log. Traefik, which has no
// package here, is played from deploy/traefik's files: the auth requests
// its entry point and ForwardAuth make, and its access log sent on by
// `tally ship-access-log`. It holds tests only.
package gateways
