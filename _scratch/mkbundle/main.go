package main

import (
	"fmt"
	"os"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/rootfs"
)

// usage: mkbundle PARENT ID CGROUPPATH CODE
func main() {
	cfg := bundle.Config{Rootfs: "/var/cache/mcp-exec/rootfs/90ff45400b38b567", Python: rootfs.PythonPath, Limits: policy.DefaultLimits()}
	b, err := bundle.New(os.Args[1], cfg, bundle.Input{ID: os.Args[2], Code: []byte(os.Args[4])})
	if err != nil {
		panic(err)
	}
	if os.Args[3] != "" {
		b.Spec.Linux.CgroupsPath = os.Args[3]
	}
	if err := b.WriteSpec(); err != nil {
		panic(err)
	}
	fmt.Println(b.Dir)
}
