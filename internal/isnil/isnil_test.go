package isnil

import (
	"bytes"
	"io"
	"testing"
)

func TestNil(t *testing.T) {
	var buf *bytes.Buffer
	var w io.Writer = buf
	var f func()
	var m map[string]int
	for name, c := range map[string]struct {
		v    any
		want bool
	}{
		"nil":               {nil, true},
		"typed nil pointer": {w, true},
		"nil func":          {f, true},
		"nil map":           {m, false}, // a map type's methods may work on nil
		"pointer":           {&bytes.Buffer{}, false},
		"value":             {3, false},
		"empty string":      {"", false},
	} {
		if got := Nil(c.v); got != c.want {
			t.Errorf("%s: Nil = %v, want %v", name, got, c.want)
		}
	}
}
