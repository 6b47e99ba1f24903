package loadgen

import (
	"bytes"
	"encoding/xml"
	"io"
	"math"
	"strconv"
)

// A Point is one point of a Series.
type Point struct{ X, Y float64 }

// A Series is a named line of a Chart.
type Series struct {
	Name   string
	Points []Point
}

// A Chart is a line chart of one or more series.
type Chart struct {
	Title, XLabel, YLabel string
	Series                []Series
	LogY                  bool // logarithmic Y axis, for latencies
}

// Chart geometry, in SVG user units.
const (
	svgWidth   = 800
	svgHeight  = 480
	plotLeft   = 80.0
	plotRight  = 610.0
	plotTop    = 50.0
	plotBottom = 410.0
	legendLeft = 630.0
)

// palette holds the series colours, used in turn; series beyond its length
// are also dashed.
var palette = [...]string{
	"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
	"#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
}

// WriteSVG writes c to w as a standalone SVG document of 800x480 pixels:
// one line with point markers per series, each in its own colour, a legend,
// axes with about five labelled ticks each, the title and the axis labels.
// The axes span the points of all series. Points with a coordinate that is
// not finite, and on a logarithmic Y axis points with Y <= 0, are left out.
// The output depends only on c.
func (c Chart) WriteSVG(w io.Writer) error {
	var b bytes.Buffer
	p := &svgPrinter{b: &b}

	// Ranges of the points that can be drawn.
	xlo, xhi := math.Inf(1), math.Inf(-1)
	ylo, yhi := math.Inf(1), math.Inf(-1)
	for _, s := range c.Series {
		for _, pt := range s.Points {
			if !c.drawable(pt) {
				continue
			}
			xlo, xhi = min(xlo, pt.X), max(xhi, pt.X)
			ylo, yhi = min(ylo, pt.Y), max(yhi, pt.Y)
		}
	}
	xa := linearAxis(xlo, xhi)
	var ya axis
	if c.LogY {
		ya = logAxis(ylo, yhi)
	} else {
		ya = linearAxis(ylo, yhi)
	}
	px := func(x float64) float64 { return plotLeft + xa.pos(x)*(plotRight-plotLeft) }
	py := func(y float64) float64 { return plotBottom - ya.pos(y)*(plotBottom-plotTop) }

	p.raw(`<?xml version="1.0" encoding="UTF-8"?>` + "\n")
	p.raw(`<svg xmlns="http://www.w3.org/2000/svg" width="800" height="480" viewBox="0 0 800 480" font-family="sans-serif">` + "\n")
	p.raw(`<rect x="0" y="0" width="800" height="480" fill="#ffffff"/>` + "\n")
	if c.Title != "" {
		p.raw("<title>")
		p.text(c.Title)
		p.raw("</title>\n")
		p.textAt(svgWidth/2, 28, "middle", 18, c.Title)
	}

	// Grid, ticks and tick labels.
	for _, v := range xa.ticks {
		x := px(v)
		p.raw(`<line x1="`).num(x).raw(`" y1="`).num(plotTop).raw(`" x2="`).num(x).raw(`" y2="`).num(plotBottom + 5).raw(`" stroke="#dddddd"/>` + "\n")
		p.textAt(x, plotBottom+20, "middle", 12, xa.label(v))
	}
	for _, v := range ya.ticks {
		y := py(v)
		p.raw(`<line x1="`).num(plotLeft - 5).raw(`" y1="`).num(y).raw(`" x2="`).num(plotRight).raw(`" y2="`).num(y).raw(`" stroke="#dddddd"/>` + "\n")
		p.textAt(plotLeft-8, y+4, "end", 12, ya.label(v))
	}
	p.raw(`<rect x="`).num(plotLeft).raw(`" y="`).num(plotTop).raw(`" width="`).num(plotRight - plotLeft).raw(`" height="`).num(plotBottom - plotTop).raw(`" fill="none" stroke="#333333"/>` + "\n")
	if c.XLabel != "" {
		p.textAt((plotLeft+plotRight)/2, plotBottom+45, "middle", 14, c.XLabel)
	}
	if c.YLabel != "" {
		cx, cy := 22.0, (plotTop+plotBottom)/2
		p.raw(`<text transform="rotate(-90 `).num(cx).raw(" ").num(cy).raw(`)" x="`).num(cx).raw(`" y="`).num(cy).raw(`" text-anchor="middle" font-size="14">`)
		p.text(c.YLabel)
		p.raw("</text>\n")
	}

	// Series and legend.
	for i, s := range c.Series {
		colour := palette[i%len(palette)]
		dash := ""
		if i >= len(palette) {
			dash = ` stroke-dasharray="6 3"`
		}
		p.raw(`<g stroke="` + colour + `" fill="` + colour + `">` + "\n")
		n := 0
		for _, pt := range s.Points {
			if c.drawable(pt) {
				n++
			}
		}
		if n > 1 {
			p.raw(`<polyline fill="none" stroke-width="2"` + dash + ` points="`)
			sep := ""
			for _, pt := range s.Points {
				if c.drawable(pt) {
					p.raw(sep).num(px(pt.X)).raw(",").num(py(pt.Y))
					sep = " "
				}
			}
			p.raw(`"/>` + "\n")
		}
		for _, pt := range s.Points {
			if c.drawable(pt) {
				p.raw(`<circle cx="`).num(px(pt.X)).raw(`" cy="`).num(py(pt.Y)).raw(`" r="3"/>` + "\n")
			}
		}
		ly := plotTop + 10 + float64(i)*20
		p.raw(`<line x1="`).num(legendLeft).raw(`" y1="`).num(ly).raw(`" x2="`).num(legendLeft + 24).raw(`" y2="`).num(ly).raw(`" stroke-width="2"` + dash + `/>` + "\n")
		p.raw(`<circle cx="`).num(legendLeft + 12).raw(`" cy="`).num(ly).raw(`" r="3"/>` + "\n")
		p.raw("</g>\n")
		name := s.Name
		if name == "" {
			name = "series " + strconv.Itoa(i+1)
		}
		p.textAt(legendLeft+32, ly+4, "start", 12, name)
	}
	p.raw("</svg>\n")

	_, err := w.Write(b.Bytes())
	return err
}

// drawable reports whether pt can be drawn on c's axes.
func (c Chart) drawable(pt Point) bool {
	if math.IsNaN(pt.X) || math.IsInf(pt.X, 0) || math.IsNaN(pt.Y) || math.IsInf(pt.Y, 0) {
		return false
	}
	return !c.LogY || pt.Y > 0
}

// An axis maps values in [lo, hi] to [0, 1], linearly or logarithmically.
type axis struct {
	lo, hi float64
	log    bool
	step   float64 // tick spacing of a linear axis
	ticks  []float64
}

func (a axis) pos(v float64) float64 {
	if a.log {
		return (math.Log10(v) - math.Log10(a.lo)) / (math.Log10(a.hi) - math.Log10(a.lo))
	}
	return (v - a.lo) / (a.hi - a.lo)
}

// label formats a tick value.
func (a axis) label(v float64) string {
	if a.log {
		if v >= 1e-4 && v < 1e6 {
			return strconv.FormatFloat(v, 'f', -1, 64)
		}
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
	if math.Abs(v) < a.step*1e-9 {
		v = 0
	}
	if a.step >= 1e6 || a.step < 1e-4 {
		return strconv.FormatFloat(v, 'g', 4, 64)
	}
	prec := max(0, -int(math.Floor(math.Log10(a.step)+1e-9)))
	return strconv.FormatFloat(v, 'f', prec, 64)
}

// linearAxis returns an axis covering [lo, hi] with round ticks about a
// fifth of the range apart. An empty range (lo > hi) gives [0, 1].
func linearAxis(lo, hi float64) axis {
	if lo > hi {
		lo, hi = 0, 1
	}
	if lo == hi {
		if lo == 0 {
			hi = 1
		} else {
			d := math.Abs(lo) * 0.1
			lo, hi = lo-d, hi+d
		}
	}
	step := niceStep((hi - lo) / 4)
	a := axis{step: step}
	a.lo = math.Floor(lo/step) * step
	a.hi = math.Ceil(hi/step) * step
	for i := 0; ; i++ {
		v := a.lo + float64(i)*step
		if v > a.hi+step*1e-9 {
			break
		}
		a.ticks = append(a.ticks, v)
	}
	return a
}

// niceStep returns the number of the form 1, 2 or 5 times a power of ten
// nearest to x.
func niceStep(x float64) float64 {
	e := math.Floor(math.Log10(x))
	f := x / math.Pow(10, e)
	switch {
	case f < 1.5:
		f = 1
	case f < 3:
		f = 2
	case f < 7:
		f = 5
	default:
		f = 10
	}
	return f * math.Pow(10, e)
}

// logAxis returns a logarithmic axis from the power of ten at or below lo
// to the one at or above hi, with ticks at powers of ten, and also at 2 and
// 5 times them when the axis spans at most two decades. An empty range
// (lo > hi) gives [1, 10].
func logAxis(lo, hi float64) axis {
	if lo > hi {
		lo, hi = 1, 10
	}
	e0 := int(math.Floor(math.Log10(lo)))
	e1 := int(math.Ceil(math.Log10(hi)))
	if e1 <= e0 {
		e1 = e0 + 1
	}
	a := axis{lo: math.Pow10(e0), hi: math.Pow10(e1), log: true}
	n := e1 - e0
	stride := (n + 4) / 5
	for e := e0; e <= e1; e += stride {
		a.ticks = append(a.ticks, math.Pow10(e))
		if n <= 2 && e < e1 {
			a.ticks = append(a.ticks, 2*math.Pow10(e), 5*math.Pow10(e))
		}
	}
	return a
}

// An svgPrinter accumulates an SVG document.
type svgPrinter struct {
	b *bytes.Buffer
}

func (p *svgPrinter) raw(s string) *svgPrinter {
	p.b.WriteString(s)
	return p
}

// num writes v with two decimals.
func (p *svgPrinter) num(v float64) *svgPrinter {
	p.b.Write(strconv.AppendFloat(p.b.AvailableBuffer(), v, 'f', 2, 64))
	return p
}

// text writes s escaped as XML character data.
func (p *svgPrinter) text(s string) {
	xml.EscapeText(p.b, []byte(s))
}

// textAt writes a text element.
func (p *svgPrinter) textAt(x, y float64, anchor string, size int, s string) {
	p.raw(`<text x="`).num(x).raw(`" y="`).num(y).raw(`" text-anchor="` + anchor + `" font-size="` + strconv.Itoa(size) + `">`)
	p.text(s)
	p.raw("</text>\n")
}
