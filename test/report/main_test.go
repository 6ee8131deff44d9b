package main

import (
	"strings"
	"testing"
)

func TestReport(t *testing.T) {
	in := strings.Join([]string{
		`{"Action":"start","Package":"p"}`,
		`{"Action":"run","Package":"p","Test":"TestA"}`,
		`{"Action":"output","Package":"p","Test":"TestA","Output":"=== RUN   TestA\n"}`,
		`{"Action":"pass","Package":"p","Test":"TestA","Elapsed":0.5}`,
		`{"Action":"output","Package":"p","Test":"TestB","Output":"    b_test.go:3: went wrong\n"}`,
		`{"Action":"fail","Package":"p","Test":"TestB","Elapsed":2}`,
		`{"Action":"pass","Package":"p","Test":"TestC","Elapsed":3}`,
		`{"Action":"output","Package":"p","Output":"FAIL\tp\t5.1s\n"}`,
		`{"Action":"fail","Package":"p","Elapsed":5.1}`,
		`{"Action":"start","Package":"q"}`,
	}, "\n")
	var out strings.Builder
	r := &report{w: &out, output: map[string][]string{}, started: map[string]bool{}}
	if err := r.read(strings.NewReader(in)); err != nil {
		t.Fatal(err)
	}
	status := r.summary(1)
	got := out.String()
	for _, want := range []string{"--- FAIL: p TestB (2.00s)\n    b_test.go:3: went wrong\n", "FAIL\tp\t5.1s\n",
		"the 1 slowest tests:\n      3.00s  p TestC\n", "FAIL: q ended without a result", "FAILED: p TestB, p"} {
		if !strings.Contains(got, want) {
			t.Errorf("report lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "TestA") || status != 1 {
		t.Errorf("status %d, report:\n%s\nwant 1, no line of the passing TestA outside the slowest", status, got)
	}
}
