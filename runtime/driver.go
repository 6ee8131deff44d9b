package runtime

import (
	_ "embed"
	"fmt"
	"regexp"
	"strconv"

	"github.com/inhuman/mcp-exec/policy"
)

// driverTemplate is the interpreter's program: it runs the code as a
// notebook cell (driver.py says how). Its @NAME@s are the protocol's.
//
//go:embed driver.py
var driverTemplate string

// driverSource is driverTemplate with the protocol's values in place.
var driverSource = renderDriver()

func renderDriver() string {
	values := map[string]string{
		"WORK_DIR":     policy.WorkDir,
		"OUTPUTS_NAME": policy.OutputsName,
		"MAX_FRAME":    strconv.Itoa(maxFrame),
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
	return regexp.MustCompile(`@[A-Z_]+@`).ReplaceAllStringFunc(driverTemplate, func(m string) string {
		v, ok := values[m[1:len(m)-1]]
		if !ok {
			panic(fmt.Sprintf("driver.py names %s, which the protocol does not define", m))
		}
		return v
	})
}

// driverArgv is the interpreter's command line with the driver before the
// script: argv is the interpreter, its options, then the script.
func driverArgv(argv []string) []string {
	n := len(argv)
	out := append([]string{}, argv[:n-1]...)
	return append(out, "-c", driverSource, argv[n-1])
}
