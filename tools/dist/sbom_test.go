package dist_test

import (
	"os"
	"testing"

	cdx "github.com/CycloneDX/cyclonedx-go"
	"github.com/stretchr/testify/require"
)

// readSBOM decodes a CycloneDX JSON file with the CycloneDX library.
func readSBOM(t *testing.T, path string) *cdx.BOM {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	var bom cdx.BOM
	require.NoError(t, cdx.NewBOMDecoder(f, cdx.BOMFileFormatJSON).Decode(&bom))
	require.Equal(t, "CycloneDX", bom.BOMFormat)
	require.Equal(t, cdx.SpecVersion1_7, bom.SpecVersion)
	require.NotNil(t, bom.Metadata)
	require.NotNil(t, bom.Metadata.Component)
	require.NotNil(t, bom.Components)
	return &bom
}
