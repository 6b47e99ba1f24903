package loadgen

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// parseSVG checks that doc is well-formed XML with an svg root, and returns
// its character data and the number of elements of each name.
func parseSVG(t *testing.T, doc []byte) (text string, elems map[string]int) {
	t.Helper()
	elems = map[string]int{}
	var sb strings.Builder
	d := xml.NewDecoder(bytes.NewReader(doc))
	root := ""
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
				assert.Equal(t, "http://www.w3.org/2000/svg", tok.Name.Space)
			}
			elems[tok.Name.Local]++
		case xml.CharData:
			sb.Write(tok)
			sb.WriteByte('\n')
		}
	}
	require.Equal(t, "svg", root)
	return sb.String(), elems
}

func TestWriteSVG(t *testing.T) {
	c := Chart{
		Title:  "Throughput <closed loop> & friends",
		XLabel: "connections",
		YLabel: "requests/s",
		Series: []Series{
			{Name: "tally", Points: []Point{{1, 1200}, {2, 2500}, {4, 4100}, {8, 5200}}},
			{Name: `net/http "no-op"`, Points: []Point{{1, 3000}, {2, 6100}, {4, 9900}, {8, 11800}}},
		},
	}
	var buf bytes.Buffer
	require.NoError(t, c.WriteSVG(&buf))
	doc := buf.Bytes()
	assert.True(t, bytes.HasPrefix(doc, []byte("<?xml")))
	assert.Contains(t, string(doc), `width="800" height="480"`)

	text, elems := parseSVG(t, doc)
	for _, s := range []string{c.Title, c.XLabel, c.YLabel, "tally", `net/http "no-op"`} {
		assert.Contains(t, text, s)
	}
	assert.Equal(t, 2, elems["polyline"])
	assert.Equal(t, 8+2, elems["circle"]) // markers and legend
	assert.Contains(t, string(doc), "#1f77b4")
	assert.Contains(t, string(doc), "#ff7f0e")
	// Tick labels of both axes.
	assert.Contains(t, text, "\n0\n")
	assert.Contains(t, text, "\n8\n")
	assert.Contains(t, text, "\n12000\n")

	var again bytes.Buffer
	require.NoError(t, c.WriteSVG(&again))
	assert.Equal(t, doc, again.Bytes(), "output must be deterministic")
}

func TestWriteSVGLogY(t *testing.T) {
	c := Chart{
		Title:  "Latency",
		XLabel: "offered load (req/s)",
		YLabel: "p99 (ms)",
		LogY:   true,
		Series: []Series{
			{Name: "p50", Points: []Point{{1000, 0.2}, {2000, 0.3}, {4000, 1.5}, {8000, 40}}},
			{Name: "p99", Points: []Point{{1000, 0.9}, {2000, 2}, {4000, 0}, {8000, math.NaN()}, {16000, 800}}},
		},
	}
	var buf bytes.Buffer
	require.NoError(t, c.WriteSVG(&buf))
	text, elems := parseSVG(t, buf.Bytes())
	assert.Contains(t, text, "p50")
	assert.Contains(t, text, "p99")
	assert.Equal(t, 4+3+2, elems["circle"]) // the zero and the NaN are left out
	for _, tick := range []string{"0.1", "1", "10", "100", "1000"} {
		assert.Contains(t, text, "\n"+tick+"\n")
	}
	assert.NotContains(t, buf.String(), "NaN")
	assert.NotContains(t, buf.String(), "Inf")
}

func TestWriteSVGSinglePointAndEmpty(t *testing.T) {
	for _, c := range []Chart{
		{Title: "one", Series: []Series{{Name: "only", Points: []Point{{3, 7}}}}},
		{Title: "one log", LogY: true, Series: []Series{{Name: "only", Points: []Point{{3, 7}}}}},
		{Title: "zero", Series: []Series{{Name: "zero", Points: []Point{{0, 0}}}}},
		{Title: "empty", Series: []Series{{Name: "nothing"}}},
		{Title: "no series", LogY: true},
		{},
	} {
		t.Run(c.Title, func(t *testing.T) {
			var buf bytes.Buffer
			require.NoError(t, c.WriteSVG(&buf))
			text, elems := parseSVG(t, buf.Bytes())
			assert.Zero(t, elems["polyline"])
			for _, s := range c.Series {
				assert.Contains(t, text, s.Name)
				assert.Equal(t, len(s.Points)+1, elems["circle"])
			}
			assert.NotContains(t, buf.String(), "NaN")
			assert.NotContains(t, buf.String(), "Inf")
		})
	}
}

func TestWriteSVGManySeries(t *testing.T) {
	var c Chart
	for i := range 12 {
		c.Series = append(c.Series, Series{Points: []Point{{0, float64(i)}, {1, float64(i * i)}}})
	}
	var buf bytes.Buffer
	require.NoError(t, c.WriteSVG(&buf))
	text, elems := parseSVG(t, buf.Bytes())
	assert.Equal(t, 12, elems["polyline"])
	assert.Contains(t, text, "series 12")
	assert.Contains(t, buf.String(), "stroke-dasharray")
}

type failWriter struct{}

func (failWriter) Write([]byte) (int, error) { return 0, errors.New("disk full") }

func TestWriteSVGError(t *testing.T) {
	assert.EqualError(t, Chart{}.WriteSVG(failWriter{}), "disk full")
}

func TestAxes(t *testing.T) {
	a := linearAxis(0.13, 0.91)
	assert.InDelta(t, 0.0, a.lo, 1e-12)
	assert.InDelta(t, 1.0, a.hi, 1e-12)
	assert.Len(t, a.ticks, 6)
	assert.Equal(t, "0.2", a.label(a.ticks[1]))

	a = linearAxis(-5, 5)
	assert.Equal(t, []string{"-6", "-4", "-2", "0", "2", "4", "6"}, labels(a))

	l := logAxis(0.5, 30)
	assert.Equal(t, 0.1, l.lo)
	assert.Equal(t, 100.0, l.hi)
	assert.Equal(t, []string{"0.1", "1", "10", "100"}, labels(l))
	l = logAxis(2, 30)
	assert.Equal(t, []string{"1", "2", "5", "10", "20", "50", "100"}, labels(l))
	l = logAxis(7, 7)
	assert.Equal(t, []string{"1", "2", "5", "10"}, labels(l))
	l = logAxis(1e-6, 1e6)
	assert.LessOrEqual(t, len(l.ticks), 7)
	assert.Equal(t, "1e-06", l.label(l.ticks[0]))
}

func labels(a axis) []string {
	var s []string
	for _, v := range a.ticks {
		s = append(s, a.label(v))
	}
	return s
}
