// Package isnil tells whether an interface value holds nothing usable: nil
// itself, or a nil pointer, channel or func of some type (a "typed nil",
// which compares unequal to nil and panics when its methods use it).
// Constructors use it to refuse such an argument with an error instead of
// panicking later. A nil slice or map is not counted: such a type's
// methods usually work on nil (prometheus.Gatherers gathers nothing).
package isnil

import "reflect"

// Nil reports whether v is nil or holds a nil pointer, channel, func or
// interface. It is safe for concurrent use.
func Nil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Chan, reflect.Func, reflect.Interface, reflect.UnsafePointer:
		return rv.IsNil()
	}
	return false
}
