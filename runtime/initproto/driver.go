package initproto

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"sync"

	"github.com/inhuman/mcp-exec/policy"
)

// The interpreter's program is the init program's (runtime/sandboxinit:
// driver.py runs the code as a notebook cell, zygote.py makes a template's
// interpreter fork calls), and so is the C constructor that makes this
// executable the init. A binary that imports that package links both, and
// the package hands the program over here (Link); a runtime refuses to
// start in a binary that does not (Linked), which could not be its
// sandboxes' init.
var program struct {
	sync.RWMutex
	driver, zygote string
}

// Link takes the interpreter's program, its @NAME@s still in it: the
// protocol's values go in their places. A name the protocol does not
// define is a defect of the build, and panics.
func Link(driver, zygote string) {
	d, z := Render(driver), Render(zygote)
	program.Lock()
	defer program.Unlock()
	program.driver, program.zygote = d, z
}

// ErrNotLinked: this executable does not hold the sandbox's init.
var ErrNotLinked = errors.New("this executable does not link the sandbox's init (a binary that starts sandboxes imports runtime/sandboxinit, as cmd/mcp-exec does)")

// Linked says whether this executable can be the sandbox's init.
func Linked() error {
	program.RLock()
	defer program.RUnlock()
	if program.driver == "" {
		return ErrNotLinked
	}
	return nil
}

var placeholder = regexp.MustCompile(`@[A-Z_]+@`)

// Render puts the protocol's values in the places of src's @NAME@s.
func Render(src string) string {
	values := map[string]string{
		"WORK_DIR":     policy.WorkDir,
		"OUTPUTS_NAME": policy.OutputsName,
		"MAX_FRAME":    strconv.Itoa(MaxFrame),
	}
	for _, d := range protocol {
		switch v := d.value.(type) {
		case string:
			values[d.name] = v
		case byte:
			values[d.name] = string(v)
		case int:
			values[d.name] = strconv.Itoa(v)
		}
	}
	return placeholder.ReplaceAllStringFunc(src, func(m string) string {
		v, ok := values[m[1:len(m)-1]]
		if !ok {
			panic(fmt.Sprintf("the interpreter's program names %s, which the protocol does not define", m))
		}
		return v
	})
}

// Argv is the interpreter's command line with the driver before the
// script: argv is the interpreter, its options, then the script. A
// template's interpreter runs the zygote too, and is told so after the
// script.
func Argv(argv []string, template bool) []string {
	program.RLock()
	src := program.driver
	if template {
		src += program.zygote
	}
	program.RUnlock()
	n := len(argv)
	out := append([]string{}, argv[:n-1]...)
	out = append(out, "-c", src, argv[n-1])
	if template {
		out = append(out, TemplateMarker)
	}
	return out
}
