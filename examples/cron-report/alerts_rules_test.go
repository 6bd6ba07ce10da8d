package main

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestAlertRules: the rules README.md shows are alerts.yml, and, when
// promtool is installed (it must be under CI), they parse and pass
// alerts_test.yml.
func TestAlertRules(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	rules, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	_, block, ok := strings.Cut(string(readme), "```yaml\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 || block != string(rules) {
		t.Fatalf("README.md's yaml block and alerts.yml differ:\n%s\n---\n%s", block, rules)
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("promtool not on the PATH under CI: scripts/test.sh installs it (Debian's prometheus package)")
		}
		t.Skip("promtool not on the PATH: alerts_test.yml not run (Debian's prometheus package has it)")
	}
	for _, args := range [][]string{{"check", "rules", "alerts.yml"}, {"test", "rules", "alerts_test.yml"}} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
