package dist

import (
	"bytes"
	"crypto/sha256"
	"debug/buildinfo"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"time"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"github.com/google/uuid"
)

// SBOM is the CycloneDX (JSON) bill of materials of the Go binary at path:
// the binary itself (its SHA-256, its licence, its build settings) and
// every module Go linked into it, read from the module list Go wrote into
// the binary (debug/buildinfo), each with its version, its go.sum hash and
// its package URL. The serial number is derived from the binary's hash and
// the timestamp is the commit's, so that one binary always has one SBOM.
func SBOM(path string, src Source) ([]byte, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	bi, err := buildinfo.ReadFile(path)
	if err != nil {
		return nil, err
	}
	sum := sha256.Sum256(raw)
	name := filepath.Base(path)
	var goos, goarch string
	props := []cdx.Property{{Name: "go:toolchain", Value: bi.GoVersion}}
	for _, s := range bi.Settings {
		switch s.Key {
		case "GOOS":
			goos = s.Value
		case "GOARCH":
			goarch = s.Value
		}
		props = append(props, cdx.Property{Name: "go:build:" + s.Key, Value: s.Value})
	}
	licence := &cdx.Licenses{{License: &cdx.License{ID: "Apache-2.0"}}}
	main := cdx.Component{
		BOMRef: "pkg:golang/" + bi.Main.Path + "@v" + src.Version + "#cmd/" + name, Type: cdx.ComponentTypeApplication,
		Name: name, Version: src.Version, Description: "Tally's " + name + " for " + goos + "/" + goarch,
		PackageURL: fmt.Sprintf("pkg:golang/%s@v%s?goos=%s&goarch=%s#cmd/%s", bi.Main.Path, src.Version, goos, goarch, name),
		Hashes:     &[]cdx.Hash{{Algorithm: cdx.HashAlgoSHA256, Value: hex.EncodeToString(sum[:])}},
		Licenses:   licence, Properties: &props,
		ExternalReferences: &[]cdx.ExternalReference{{Type: cdx.ERTypeVCS, URL: "https://github.com/tallyhq/tally", Comment: "commit " + src.Commit}},
	}
	var comps []cdx.Component
	var refs []string
	for _, d := range bi.Deps {
		m := d
		if d.Replace != nil {
			m = d.Replace
		}
		c := cdx.Component{BOMRef: "pkg:golang/" + m.Path + "@" + m.Version, Type: cdx.ComponentTypeLibrary,
			Name: m.Path, Version: m.Version, PackageURL: "pkg:golang/" + m.Path + "@" + m.Version, Scope: cdx.ScopeRequired}
		if m.Sum != "" {
			c.Properties = &[]cdx.Property{{Name: "go:module:sum", Value: m.Sum}}
		}
		if d.Replace != nil {
			c.Pedigree = &cdx.Pedigree{Notes: "replaces " + d.Path + "@" + d.Version}
		}
		comps = append(comps, c)
		refs = append(refs, c.BOMRef)
	}
	bom := cdx.NewBOM()
	bom.SerialNumber = uuid.NewSHA1(uuid.NameSpaceURL, []byte("tally-sbom:"+hex.EncodeToString(sum[:]))).URN()
	bom.Metadata = &cdx.Metadata{
		Timestamp: src.Time.UTC().Format(time.RFC3339),
		Component: &main,
		Tools: &cdx.ToolsChoice{Components: &[]cdx.Component{{Type: cdx.ComponentTypeLibrary, Name: "github.com/CycloneDX/cyclonedx-go",
			Description: "with the module list of Go's debug/buildinfo"}}},
	}
	bom.Components = &comps
	bom.Dependencies = &[]cdx.Dependency{{Ref: main.BOMRef, Dependencies: &refs}}
	var buf bytes.Buffer
	enc := cdx.NewBOMEncoder(&buf, cdx.BOMFileFormatJSON)
	enc.SetPretty(true)
	if err := enc.Encode(bom); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
