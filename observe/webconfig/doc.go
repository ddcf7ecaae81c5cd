// Package webconfig reads the web configuration file that Prometheus
// exporters share (node_exporter's --web.config.file: TLS and basic
// authentication for the metrics endpoint, served by
// github.com/prometheus/exporter-toolkit/web) from the side of a client
// that must reach a server using it.
//
// A pstrain task serves /metrics and /healthz with such a file
// (observe/metrics.Server). `pstrain run` probes and scrapes its own
// tasks, so it cannot take the user's file as it is: the passwords in it
// are bcrypt hashes. [ForLauncher] writes a copy of the user's file for
// the tasks with one more user, [LauncherUser], whose password only the
// launcher knows, and returns the [Client] that the launcher's health
// probes and scrapes use: HTTPS when the file enables TLS, trusting
// exactly the certificate the tasks serve (read again at every
// handshake, as the servers do, so a renewed certificate is followed),
// and the launcher's basic-auth credentials when the file has users.
//
// A file that requires client certificates (client_auth_type
// RequireAnyClientCert or RequireAndVerifyClientCert) is refused by
// ForLauncher: the launcher has no certificate to present.
package webconfig
