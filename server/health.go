package server

import (
	"errors"
)

// errShuttingDown refuses a call, and readiness, once the server stops.
var errShuttingDown = errors.New("the server is shutting down")

// Ready is nil while the server takes calls: it is not shutting down, and
// its engine says it can run them (Options.Ready). GET /readyz answers it.
func (s *Server) Ready() error {
	s.mu.Lock()
	closing := s.closing
	s.mu.Unlock()
	if closing {
		return errShuttingDown
	}
	if s.opts.Ready != nil {
		return s.opts.Ready()
	}
	return nil
}
