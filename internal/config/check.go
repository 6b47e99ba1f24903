package config

import (
	"bytes"
	"cmp"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/tallyhq/tally/internal/setting"
)

// Problem is one thing wrong in a configuration file.
type Problem struct {
	// Line is the problem's line in the file; 0 when it cannot be placed
	// (a setting from the environment).
	Line int
	// Field is the setting's path as the file spells it
	// ("policies[1].limit"); "" for the file as a whole.
	Field string
	// Msg says what is wrong and what would do ("-1: want 1 to 1000000000").
	Msg string
}

// String is the problem on one line, "line 12: policies[1].limit: -1: want
// 1 to 1000000000", without the parts it lacks.
func (p Problem) String() string {
	parts := make([]string, 0, 3)
	if p.Line > 0 {
		parts = append(parts, "line "+strconv.Itoa(p.Line))
	}
	if p.Field != "" {
		parts = append(parts, p.Field)
	}
	if p.Msg != "" {
		parts = append(parts, p.Msg)
	}
	return strings.Join(parts, ": ")
}

// maxSyntaxErrors bounds the syntax errors Check reads past.
const maxSyntaxErrors = 20

// Check reads b as Parse does and returns every problem it finds, in the
// order of the file's lines (problems without a line last); none for a
// file Parse accepts. A problem the decoder finds does not hide the
// others: past fields it cannot place (an unknown field, a value of the
// wrong type) Check judges the settings it could read, but not those
// fields again; past a syntax error it reads the file again without that
// line (up to maxSyntaxErrors times), and then judges only the settings
// the file writes (a missing one may be on the line left out).
func Check(b []byte, env func(string) string) []Problem {
	var out []Problem
	for range maxSyntaxErrors {
		f, root, ps := read(b, env)
		var de decodeError
		if f != nil || len(ps) == 0 || !errors.As(ps[0], &de) {
			out = append(out, checked(root, ps, len(out) > 0)...)
			break
		}
		syntax := decodeProblems(root, de.err)
		if len(syntax) == 1 && len(out) > 0 && out[len(out)-1] == syntax[0] {
			break // leaving its line out did not help: nothing more can be read
		}
		out = append(out, syntax...)
		if len(syntax) != 1 || syntax[0].Line == 0 {
			break // nothing to read past
		}
		b = withoutLine(b, syntax[0].Line)
	}
	slices.SortStableFunc(out, func(a, b Problem) int {
		switch {
		case a.Line == b.Line:
			return 0
		case a.Line == 0:
			return 1
		case b.Line == 0:
			return -1
		}
		return cmp.Compare(a.Line, b.Line)
	})
	return out
}

// checked turns the problems of a file that decoded, at least in part,
// into Problems: the fields the decoder could not place are not judged
// again, and with lines left out (syntax errors before) only settings the
// file writes are.
func checked(root *yaml.Node, ps problems, linesLeftOut bool) []Problem {
	var out []Problem
	var bad []string // the fields the decoder could not place
	for _, err := range ps {
		var de decodeError
		if errors.As(err, &de) {
			for _, p := range decodeProblems(root, de.err) {
				out = append(out, p)
				bad = append(bad, p.Field)
			}
		}
	}
	for _, err := range ps {
		var de decodeError
		var se *setting.Error
		switch {
		case errors.As(err, &de):
		case errors.As(err, &se):
			if (linesLeftOut && !written(root, se.Field)) || slices.ContainsFunc(bad, func(f string) bool { return under(se.Field, f) }) {
				continue // a consequence of what the decoder could not read
			}
			out = append(out, Problem{Line: lineOf(root, se.Field), Field: se.Field, Msg: se.Msg})
		default: // the environment's: the key secret
			out = append(out, Problem{Msg: strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": ")})
		}
	}
	return out
}

// under reports whether field is path or a setting within it.
func under(field, path string) bool {
	return path != "" && (field == path || strings.HasPrefix(field, path+".") || strings.HasPrefix(field, path+"["))
}

// withoutLine is b with line n (from 1) emptied, the others where they were.
func withoutLine(b []byte, n int) []byte {
	lines := bytes.Split(b, []byte("\n"))
	if n >= 1 && n <= len(lines) {
		lines[n-1] = nil
	}
	return bytes.Join(lines, []byte("\n"))
}

// read decodes b, overrides it from env, applies the defaults and checks
// every setting. It returns the file, its document (where problems find
// their lines) and every problem in the order the file is checked. A file
// with a syntax error is not checked further (no file is returned): its
// problem is the decoder's error, a decodeError. A file with fields the
// decoder could not place (a *yaml.TypeError) is checked as far as it was
// read, the decoder's error first.
func read(b []byte, env func(string) string) (*File, *yaml.Node, problems) {
	var root yaml.Node
	_ = yaml.Unmarshal(b, &root) // fails only where Decode does
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	var ps problems
	if err := dec.Decode(&f); err != nil {
		var te *yaml.TypeError
		if !errors.As(err, &te) {
			return nil, &root, problems{decodeError{err}}
		}
		ps.add(decodeError{err})
	}
	f.applyEnv(&ps, env)
	f.withDefaults()
	f.validate(&ps)
	return &f, &root, ps
}

// decodeError is a file the YAML decoder refused: a syntax error, or
// fields it could not place (a *yaml.TypeError, one message each).
type decodeError struct{ err error }

func (e decodeError) Error() string { return e.err.Error() }

// decodeProblems are the decoder's messages as problems: a syntax error is
// one, a *yaml.TypeError one for each field it could not place.
func decodeProblems(root *yaml.Node, err error) []Problem {
	if errors.Is(err, io.EOF) {
		return []Problem{{Msg: "empty: want a YAML document of settings (docs/configuration.md)"}}
	}
	msgs := []string{strings.TrimPrefix(err.Error(), "yaml: ")}
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs = te.Errors
	}
	out := make([]Problem, 0, len(msgs))
	for _, m := range msgs {
		p := Problem{Msg: m}
		if rest, ok := strings.CutPrefix(m, "line "); ok {
			if n, msg, ok := strings.Cut(rest, ": "); ok {
				if line, err := strconv.Atoi(n); err == nil {
					p.Line, p.Msg = line, msg
				}
			}
		}
		if te != nil && p.Line > 0 {
			p.Field = fieldAt(root, p.Line, p.Msg)
		}
		out = append(out, p)
	}
	return out
}

// keyAt is a key of the document and its value, with the key's path.
type keyAt struct {
	path     string
	key, val *yaml.Node
}

// keysAt appends, in the document's order, the keys under n that are on
// line or whose value starts there.
func keysAt(n *yaml.Node, path string, line int, out *[]keyAt) {
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			keysAt(c, path, line, out)
		}
	case yaml.MappingNode:
		for k := 0; k+1 < len(n.Content); k += 2 {
			key, val := n.Content[k], n.Content[k+1]
			p := key.Value
			if path != "" {
				p = path + "." + key.Value
			}
			if key.Line == line || val.Line == line {
				*out = append(*out, keyAt{p, key, val})
			}
			keysAt(val, p, line, out)
		}
	case yaml.SequenceNode:
		for i, c := range n.Content {
			keysAt(c, path+"["+strconv.Itoa(i)+"]", line, out)
		}
	}
}

// fieldAt is the path of the setting a decoder's message about line is
// about: the key it names ("field windw not found in type …"), else the
// key whose value it quotes ("cannot unmarshal !!str `soon` into …"), else
// the first key whose value starts on that line; "" when there is none.
func fieldAt(root *yaml.Node, line int, msg string) string {
	var keys []keyAt
	keysAt(root, "", line, &keys)
	var tries []func(keyAt) bool
	if rest, ok := strings.CutPrefix(msg, "field "); ok {
		name, _, _ := strings.Cut(rest, " not found")
		tries = append(tries, func(k keyAt) bool { return k.key.Line == line && k.key.Value == name })
	} else {
		if _, rest, ok := strings.Cut(msg, "`"); ok {
			quoted, _, _ := strings.Cut(rest, "`")
			prefix, cut := strings.CutSuffix(quoted, "...") // long values are cut short
			tries = append(tries, func(k keyAt) bool {
				return k.val.Kind == yaml.ScalarNode && k.val.Line == line &&
					(k.val.Value == quoted || cut && strings.HasPrefix(k.val.Value, prefix))
			})
		}
		tries = append(tries, func(k keyAt) bool { return k.val.Line == line })
	}
	for _, try := range tries {
		for _, k := range keys {
			if try(k) {
				return k.path
			}
		}
	}
	return ""
}
