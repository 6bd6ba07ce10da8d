package main

import "testing"

// TestShown: identities from the backend are printed as is when harmless
// and quoted when they hold spaces, control characters or nothing.
func TestShown(t *testing.T) {
	for in, want := range map[string]string{
		"host-1":        "host-1",
		"web-1.example": "web-1.example",
		"a b":           `"a b"`,
		"\x1b[2Jwiped":  `"\x1b[2Jwiped"`,
		"":              `""`,
		"line\nbreak":   `"line\nbreak"`,
		"日本":            "日本",
		"h\x9b[2J":      `"h\x9b[2J"`, // an 8-bit CSI, not UTF-8: it read as U+FFFD, printable
		"\xff":          `"\xff"`,
	} {
		if got := shown(in); got != want {
			t.Errorf("shown(%q) = %s, want %s", in, got, want)
		}
	}
}
