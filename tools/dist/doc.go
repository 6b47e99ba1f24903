// Package dist makes Tally's release artefacts from a commit of the
// repository, the same bytes every time:
//
//   - Release: for each platform (linux/amd64, linux/arm64) a tarball of the
//     static binaries (edge-checker, accountant, tally: CGO_ENABLED=0,
//     -trimpath, the version, commit and commit time stamped in), the
//     licence, the docs a user starts from, the example configuration and
//     the systemd units; a CycloneDX SBOM per binary, made from the module
//     list Go wrote into that binary; and SHA256SUMS of them all.
//   - Image: one OCI image for both platforms, made from the release
//     tarballs with go-containerregistry (no Docker, no shell, no package
//     manager in it), written as an OCI archive.
//
// Everything that could differ between two runs is pinned: file times are
// the commit's time, owners are root, entries are sorted, gzip carries no
// name or time, SBOMs carry no random serial number. The tests build twice
// and compare bytes. This package lives in a module of its own (tools/) so
// that the packaging libraries never enter the product's build.
package dist
