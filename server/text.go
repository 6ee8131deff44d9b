package server

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"
	"unicode"
	"unicode/utf8"

	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime"
)

// The text block is what a model reads of a call, and keeps reading on
// every turn after: it is bounded by TextBytes, while structuredContent,
// for programs, keeps each part whole up to MaxOutputBytes. It holds the
// verdict on one line, the files (below, linked, left out), then the
// result, stdout and stderr; a part that does not fit its share keeps its
// head and its tail, with the bytes left out counted between them.

// DefaultTextBytes is the text block's budget when Options.TextBytes is 0:
// about 8k tokens, which a context window bears on every call.
const DefaultTextBytes = 32 << 10

// minTextBytes leaves room for the verdict and a few lines of each part.
const minTextBytes = 1 << 10

// callText is what the text block tells of a call.
type callText struct {
	out      execOutput
	timeout  time.Duration
	cpuLimit time.Duration
	// shown says, for each of out.Files, how it came back: "below" (a
	// content block), "image below", or "link" (a resource_link to its
	// uri).
	shown []string
	// endDetail says what ended the session, when out.SessionEnded alone
	// would mislead.
	endDetail string
	// memoryRefused: oom_killed means the process runtime's memory limit
	// refused an allocation (MemoryError), not a kill.
	memoryRefused bool
}

// textBytes is the text block's budget.
func (o Options) textBytes() int {
	if o.TextBytes == 0 {
		return DefaultTextBytes
	}
	return int(o.TextBytes)
}

// summary is the text block.
func (s *Server) summary(c callText) string {
	budget := s.opts.textBytes()
	head := clipText(s.verdictLine(c)+networkText(c.out.Egress)+s.filesText(c), budget/2)
	out := c.out
	parts := []textPart{{"result", out.Result}, {"stdout", out.Stdout}, {"stderr", out.Stderr}}
	return head + fitParts(parts, budget-len(head))
}

// verdictLine is how the call ended, on one line.
func (s *Server) verdictLine(c callText) string {
	out, o := c.out, s.opts
	var b strings.Builder
	fmt.Fprintf(&b, "exit code %d", out.ExitCode)
	switch {
	case strings.HasPrefix(out.Signal, "SIG"):
		fmt.Fprintf(&b, ", killed by %s (signal %d)", out.Signal, out.ExitCode-128)
	case out.Signal != "":
		fmt.Fprintf(&b, ", killed by %s", out.Signal)
	}
	if out.TimedOut {
		b.WriteString("; " + timeoutText(out, c.timeout))
	}
	if out.CPULimited {
		b.WriteString("; " + cpuLimitText(out, c.cpuLimit))
	}
	switch {
	case out.OOMKilled && c.memoryRefused:
		fmt.Fprintf(&b, "; the memory limit (%d MiB) refused an allocation, and the MemoryError ended the code", o.Limits.MemoryBytes/mib)
	case out.OOMKilled:
		fmt.Fprintf(&b, "; killed by the memory limit (%d MiB)", o.Limits.MemoryBytes/mib)
	}
	if out.PidsLimited {
		fmt.Fprintf(&b, "; hit the process limit (%d)", o.Limits.Pids)
	}
	for _, t := range []struct {
		name    string
		cut     bool
		written int64
	}{{"stdout", out.StdoutTruncated, out.StdoutBytes}, {"stderr", out.StderrTruncated, out.StderrBytes}} {
		if t.cut {
			fmt.Fprintf(&b, "; %s truncated at %d bytes (%d written)", t.name, o.MaxOutputBytes, t.written)
		}
	}
	if out.ResultTruncated {
		fmt.Fprintf(&b, "; result truncated at %d bytes", o.MaxOutputBytes)
	}
	if out.Session != "" {
		fmt.Fprintf(&b, "; persistent session %s", out.Session)
		if out.SessionEnded != "" {
			fmt.Fprintf(&b, " ended (%s)", describeEnd(out.SessionEnded, c.endDetail, o))
		}
	}
	fmt.Fprintf(&b, " (%d ms)\n", out.DurationMS)
	return b.String()
}

// timeoutText says what a timeout did: a fresh call's sandbox is killed;
// a session's code is interrupted, and if it stops the session lives on
// (else the session's end says it was killed).
func timeoutText(out execOutput, timeout time.Duration) string {
	after := fmt.Sprintf("timed out after %s s", fmtSeconds(timeout))
	switch {
	case out.Session == "":
		return after + ": the sandbox was killed"
	case out.SessionEnded == runtime.EndTimeout:
		return after
	case out.SessionEnded == "":
		return after + ": the code was interrupted (KeyboardInterrupt) and stopped; the session and its variables live on"
	}
	return after + ": the code was interrupted (KeyboardInterrupt) and stopped"
}

// cpuLimitText says what reaching the CPU limit did, as timeoutText
// says it of the wall clock.
func cpuLimitText(out execOutput, limit time.Duration) string {
	reached := fmt.Sprintf("CPU time limit of %s s reached", fmtSeconds(limit))
	switch {
	case out.Session == "":
		return reached + ": the sandbox was killed"
	case out.SessionEnded == "":
		return reached + ": the code was interrupted (KeyboardInterrupt) and stopped; the session and its variables live on"
	}
	return reached
}

// shownName is a file name the code chose, as the text lists it: quoted
// (Go syntax) when it holds a control character, a quote or a backslash,
// or begins or ends with a space, so that no name can write a line of the
// server's own text (red team F7); bounded.
func shownName(p string) string {
	if strings.ContainsFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f || r == '"' || r == '\\' || !unicode.IsPrint(r) }) ||
		strings.TrimSpace(p) != p {
		return clip(strconv.Quote(p), 200)
	}
	return clip(p, 200)
}

// filesText lists the call's files, how each came back, and what was left
// out and why.
func (s *Server) filesText(c callText) string {
	out, o := c.out, s.opts
	var b strings.Builder
	links := false
	if len(out.Files) > 0 {
		fmt.Fprintf(&b, "files from %s:\n", policy.OutputsDir)
	}
	for i, f := range out.Files {
		how := c.shown[i]
		if how == "link" {
			how, links = "resource_link "+f.URI, true
		}
		fmt.Fprintf(&b, "  %s (%d bytes): %s\n", shownName(f.Path), f.Size, how)
	}
	if links {
		fmt.Fprintf(&b, "  (read a resource_link with resources/read, or pass its uri in files[].uri to a later call; it lives %s s)\n", fmtSeconds(o.ResourceTTL))
	}
	const listed = 10
	if len(out.FilesLeftOut) > 0 {
		fmt.Fprintf(&b, "left out of %s:\n", policy.OutputsDir)
	}
	for i, l := range out.FilesLeftOut {
		if i == listed {
			fmt.Fprintf(&b, "  and %d more (files_left_out)\n", len(out.FilesLeftOut)-listed)
			break
		}
		fmt.Fprintf(&b, "  %s (%d bytes): %s\n", shownName(l.Path), l.Size, leftOutText(runtime.LeftOutReason(l.Why), o))
	}
	if out.FilesTruncated && len(out.FilesLeftOut) == 0 {
		fmt.Fprintf(&b, "files were left out of %s for the limits (%d files, %d bytes in all)\n", policy.OutputsDir, o.MaxFiles, o.MaxFileBytes)
	}
	return b.String()
}

// networkText lists, on one line, the hosts the code reached through the
// network allowlist's proxy and what went each way, and those refused
// and why: the first few of each, the rest in egress.
func networkText(ds []egressDest) string {
	if len(ds) == 0 {
		return ""
	}
	const listed = 5
	var reached, refused []string
	more := 0
	for _, d := range ds {
		hp := shownName(net.JoinHostPort(d.Host, strconv.Itoa(d.Port)))
		switch {
		case d.Allowed && len(reached) < listed:
			reached = append(reached, fmt.Sprintf("%s (%d bytes out, %d in)", hp, d.BytesOut, d.BytesIn))
		case !d.Allowed && len(refused) < listed:
			refused = append(refused, fmt.Sprintf("%s (%s)", hp, clip(d.Refused, 120)))
		default:
			more++
		}
	}
	var b strings.Builder
	b.WriteString("network:")
	if len(reached) > 0 {
		b.WriteString(" reached " + strings.Join(reached, ", "))
	}
	if len(refused) > 0 {
		if len(reached) > 0 {
			b.WriteString(";")
		}
		b.WriteString(" refused " + strings.Join(refused, ", "))
	}
	if more > 0 {
		fmt.Fprintf(&b, "; and %d more (egress)", more)
	}
	return b.String() + "\n"
}

// leftOutText says why an output was left out.
func leftOutText(why runtime.LeftOutReason, o Options) string {
	switch why {
	case runtime.LeftCount:
		return fmt.Sprintf("past the limit of %d files (MCP_EXEC_MAX_FILES)", o.MaxFiles)
	case runtime.LeftBytes:
		return fmt.Sprintf("it would take the call's files past %d bytes (MCP_EXEC_MAX_FILE_BYTES)", o.MaxFileBytes)
	case runtime.LeftUnreadable:
		return "it could not be read (the code took its permissions away, or it changed as it was read)"
	case runtime.LeftLimits:
		return "past the bounds of the walk of " + policy.OutputsDir + " (32 levels, 4096 entries a directory, 100000 in all, 4096-byte paths)"
	}
	return string(why)
}

// textPart is one part of the text block: its name and its text.
type textPart struct{ name, text string }

// fitParts renders the parts that are not empty within budget bytes: each
// whole when all fit; else a part smaller than an even share of what is
// left stays whole, and each other gets that share, as its head and tail.
func fitParts(parts []textPart, budget int) string {
	var live []textPart
	for _, p := range parts {
		if p.text != "" {
			live = append(live, p)
		}
	}
	sizes := make([]int, len(live))
	for i, p := range live {
		sizes[i] = len(partLabel(p.name)) + len(p.text) + 1
	}
	shares := waterfill(sizes, budget)
	var b strings.Builder
	for i, p := range live {
		text := clipPart(p.text, p.name, shares[i]-len(partLabel(p.name))-1)
		b.WriteString(partLabel(p.name) + text)
		if !strings.HasSuffix(text, "\n") {
			b.WriteByte('\n')
		}
	}
	return b.String()
}

func partLabel(name string) string { return "--- " + name + " ---\n" }

// waterfill shares budget among sizes: the smallest first, each its size
// or an even share of what is left, whichever is less.
func waterfill(sizes []int, budget int) []int {
	order := make([]int, len(sizes))
	for i := range order {
		order[i] = i
	}
	// Insertion sort: three parts at most.
	for i := 1; i < len(order); i++ {
		for j := i; j > 0 && sizes[order[j]] < sizes[order[j-1]]; j-- {
			order[j], order[j-1] = order[j-1], order[j]
		}
	}
	shares := make([]int, len(sizes))
	left := max(budget, 0)
	for k, i := range order {
		shares[i] = min(sizes[i], left/(len(order)-k))
		left -= shares[i]
	}
	return shares
}

// clipPart is text within n bytes: whole, or its head and tail (half each,
// cut at a line end where one is near, always between characters) around
// a line that counts the bytes left out.
func clipPart(text, name string, n int) string {
	if len(text) <= n {
		return text
	}
	marker := func(left int) string {
		return fmt.Sprintf("\n[… %d bytes of %s left out of this text …]\n", left, name)
	}
	keep := max(n-len(marker(len(text))), 0)
	head := cutHead(text, keep/2)
	tail := cutTail(text, keep-keep/2)
	m := marker(len(text) - len(head) - len(tail))
	if strings.HasSuffix(head, "\n") || head == "" {
		m = m[1:]
	}
	return head + m + tail
}

// cutHead is at most n bytes of the start of s, ending at a line end when
// that loses less than a quarter of them.
func cutHead(s string, n int) string {
	for n > 0 && n < len(s) && !utf8.RuneStart(s[n]) {
		n--
	}
	if i := strings.LastIndexByte(s[:n], '\n'); i >= 0 && i+1 >= n*3/4 {
		n = i + 1
	}
	return s[:n]
}

// cutTail is at most n bytes of the end of s, starting after a line end
// when that loses less than a quarter of them.
func cutTail(s string, n int) string {
	start := len(s) - n
	for start < len(s) && !utf8.RuneStart(s[start]) {
		start++
	}
	if i := strings.IndexByte(s[start:], '\n'); i >= 0 && i < n/4 {
		start += i + 1
	}
	return s[start:]
}

// clipText is s within n bytes, cut between characters and marked.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…\n"
	n = max(n-len(mark), 0)
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + mark
}

// signalName names signal n ("SIGSEGV"); "" for 0 (no signal).
func signalName(n int) string {
	if n <= 0 {
		return ""
	}
	if name := unix.SignalName(syscall.Signal(n)); name != "" {
		return name
	}
	return fmt.Sprintf("signal %d", n)
}
