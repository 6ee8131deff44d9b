package server

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/inhuman/mcp-exec/runtime"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func (s *Server) progress(ctx context.Context, req *mcp.CallToolRequest, stage *atomic.Int32, live *runtime.Live) (stop func()) {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return func() {}
	}
	done, exited := make(chan struct{}), make(chan struct{})
	start := time.Now()
	go func() {
		defer close(exited)
		t := time.NewTicker(s.opts.Progress)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
			}
			elapsed := time.Since(start)
			var msg string
			switch stage.Load() {
			case waitingSlot:
				msg = fmt.Sprintf("waiting for a free slot (%d running at most) for %s", s.opts.MaxConcurrency, elapsed.Round(time.Second))
			case waitingTurn:
				msg = fmt.Sprintf("waiting for the persistent session's earlier calls for %s", elapsed.Round(time.Second))
			default:
				msg = fmt.Sprintf("running for %s", elapsed.Round(time.Second))
				if newest := newestOutput(live); newest != "" {
					msg += "; " + newest
				}
			}
			err := req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
				ProgressToken: token,
				Progress:      elapsed.Seconds(), // elapsed time only grows, as progress must
				Message:       msg,
			})
			if err != nil {
				s.log.Debug("sending progress", "err", err)
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
}

// newestOutput is the last lines of a running call's newest output, for
// a progress message: "stdout: …", or "" before any.
func newestOutput(live *runtime.Live) string {
	if live == nil {
		return ""
	}
	stream, tail, seq := live.Last()
	if seq == 0 {
		return ""
	}
	// Whole lines where the tail was cut; whole characters in any case
	// (a character cut at the start is dropped, a byte that is none is
	// shown as U+FFFD).
	if i := bytes.IndexByte(tail, '\n'); i >= 0 && i < len(tail)-1 && len(tail) >= 300 {
		tail = tail[i+1:]
	}
	for i := 0; i < utf8.UTFMax-1 && len(tail) > 0 && !utf8.RuneStart(tail[0]); i++ {
		tail = tail[1:]
	}
	text := strings.TrimRight(validText(tail), "\n")
	return stream + ": " + text
}

// progress sends notifications/progress every Progress while the call
// waits or runs, when the client asked for them with a progress token, so
// that clients with a request timeout survive long runs. The returned stop
// waits for the sender, so no notification follows the result.
// A call's stage, as its progress messages say it.
const (
	waitingSlot int32 = iota // for a concurrency slot
	waitingTurn              // for its persistent session's earlier calls
	running
)
