package zkelect

import (
	"errors"
	"path"
	"strings"
	"testing"
	"unicode/utf16"

	"github.com/tenure-go/tenure"
)

// serverAcceptsPath is ZooKeeper's own check of a znode path
// (org.apache.zookeeper.common.PathUtils.validatePath, which the server
// runs on every create), over the path's UTF-16 code units as Java sees
// them.
func serverAcceptsPath(p string) bool {
	if p == "" || p[0] != '/' {
		return false
	}
	if p == "/" {
		return true
	}
	if p[len(p)-1] == '/' {
		return false
	}
	chars := utf16.Encode([]rune(p))
	last := uint16('/')
	for i := 1; i < len(chars); i++ {
		c := chars[i]
		switch {
		case c == 0:
			return false
		case c == '/' && last == '/':
			return false
		case c == '.' && last == '.':
			if chars[i-2] == '/' && (i+1 == len(chars) || chars[i+1] == '/') {
				return false
			}
		case c == '.':
			if chars[i-1] == '/' && (i+1 == len(chars) || chars[i+1] == '/') {
				return false
			}
		case c > 0 && c <= 0x1f, c >= 0x7f && c <= 0x9f, c >= 0xd800 && c <= 0xf8ff, c >= 0xfff0:
			return false
		}
		last = c
	}
	return true
}

func TestCheckKey_RefusesWhatTheServerRefuses(t *testing.T) {
	for _, k := range []string{
		"", "locks", "locks/a", "/", "/a/", "/a//b", "/a/./b", "/a/..", "/a/b\x00", "/a\nb",
		"/zookeeper", "/zookeeper/quota", "/a\u0085", "/a\ue000", "/a\uf8ff", "/a\ufff0", "/🔒",
		"/\xff", "/" + strings.Repeat("a", 1024),
	} {
		if err := CheckKey(k); !errors.Is(err, tenure.ErrInvalidConfig) {
			t.Errorf("CheckKey(%q) = %v, want ErrInvalidConfig", k, err)
		}
	}
	for _, k := range []string{"/a", "/locks/report", "/a/.b", "/a/b..", "/zookeeperx", "/é/ü", "/a\u00a0b", "/a\uf900"} {
		if err := CheckKey(k); err != nil {
			t.Errorf("CheckKey(%q) = %v, want nil", k, err)
		}
	}
}

// FuzzCheckKey: every key CheckKey accepts is a path the ZooKeeper server
// accepts, clean, outside /zookeeper, and so are the children tenure creates
// under it; CheckKey never panics and its errors wrap ErrInvalidConfig.
func FuzzCheckKey(f *testing.F) {
	for _, s := range []string{"/locks/report", "locks", "/a/../b", "/zookeeper/x", "/a\ue000", "/🔒", "/a/", "/\x7f", "//"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		err := CheckKey(key)
		if err != nil {
			if !errors.Is(err, tenure.ErrInvalidConfig) {
				t.Fatalf("CheckKey(%q) = %v, not ErrInvalidConfig", key, err)
			}
			return
		}
		if !serverAcceptsPath(key) {
			t.Fatalf("CheckKey accepts %q, which the server refuses", key)
		}
		if path.Clean(key) != key {
			t.Fatalf("CheckKey accepts %q, which is not clean (%q)", key, path.Clean(key))
		}
		if key == "/zookeeper" || strings.HasPrefix(key, "/zookeeper/") {
			t.Fatalf("CheckKey accepts %q under /zookeeper", key)
		}
		child := key + "/" + protectedPrefix + "0f1e2d3c-aaaa-4bbb-8ccc-0123456789ab" + lockMarker + "0000000001"
		if !serverAcceptsPath(child) {
			t.Fatalf("the server would refuse tenure's node %q under an accepted key", child)
		}
	})
}
