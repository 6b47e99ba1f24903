// Package freeport hands out loopback ports for servers that another
// process will bind: the redis-server, nats-server and tally processes the
// tests, make demo and make bench start.
//
// Asking the kernel for port 0 and closing the listener is not enough for
// that: between the close and the child's bind, the kernel may give the
// same port to any connection on the machine as its source port (ports for
// port 0 and for outgoing connections come from the same ephemeral range),
// and another test process may be handed it too. Either makes the child
// fail with "address already in use". So a port comes from below the
// kernel's ephemeral range, where the kernel never hands out ports itself,
// and is locked for the life of the process (a flock on a file named after
// the port in a directory every process on the machine shares): two
// processes using this package never hold the same port, and a process
// that dies releases its ports with it.
package freeport
