package main

import (
	"bytes"
	"io"
	"reflect"
	"regexp"
	"sync"
)

// The libraries name a configuration field, {MemoryBytes}, where a message
// is about a setting; only here, where the settings
// table ties each field to its variable, does a message get the name the
// operator sets: MCP_EXEC_MEMORY_MB.

// fieldVars maps each configurable field of config to its environment
// variable. The field is found from the pointer a setting writes through,
// so the table cannot name a variable for a field it does not set.
var fieldVars = sync.OnceValue(func() map[string]string {
	var c config
	m := make(map[string]string)
	for _, s := range c.settings(true) {
		p, ok := s.value.(interface{ target() any })
		if !ok {
			continue
		}
		if name := fieldAt(reflect.ValueOf(&c).Elem(), reflect.ValueOf(p.target()).Pointer()); name != "" {
			m[name] = s.env
		}
	}
	return m
})

// fieldAt is the name of the field of struct v, or of a struct within it,
// at address addr.
func fieldAt(v reflect.Value, addr uintptr) string {
	for i := range v.NumField() {
		f := v.Field(i)
		if f.Type().Kind() == reflect.Struct && f.Type().NumField() > 0 {
			if name := fieldAt(f, addr); name != "" {
				return name
			}
		}
		if f.Addr().Pointer() == addr && f.Type().Kind() != reflect.Struct {
			return v.Type().Field(i).Name
		}
	}
	return ""
}

var fieldRef = regexp.MustCompile(`\{([A-Z][A-Za-z]*[a-z][A-Za-z]*)\}`) // CamelCase: not ${ORIGIN}

// expandFields writes each {Field} a library named as its variable; a
// name that is not a setting is left as it is.
func expandFields(s string) string {
	vars := fieldVars()
	return fieldRef.ReplaceAllStringFunc(s, func(ref string) string {
		if v, ok := vars[ref[1:len(ref)-1]]; ok {
			return v
		}
		return ref
	})
}

// fieldError is err as the operator reads it: with its fields named as
// variables, and still matching what err matches.
type fieldError struct{ err error }

func (e fieldError) Error() string { return expandFields(e.err.Error()) }
func (e fieldError) Unwrap() error { return e.err }

// named returns err with its fields expanded, or nil. Expanding twice
// changes nothing: no variable's name has braces.
func named(err error) error {
	if err == nil {
		return nil
	}
	return fieldError{err}
}

// fieldWriter expands the fields in what is written to w. It is for
// diagnostics only (doctor's report, the server's log), each written whole
// in one Write as fmt and slog do, never for a program's output.
type fieldWriter struct{ w io.Writer }

func (f fieldWriter) Write(p []byte) (int, error) {
	if !bytes.ContainsRune(p, '{') {
		return f.w.Write(p)
	}
	if _, err := io.WriteString(f.w, expandFields(string(p))); err != nil {
		return 0, err
	}
	return len(p), nil
}
