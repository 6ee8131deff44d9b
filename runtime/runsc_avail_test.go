package runtime_test

import "testing"

// runscAvailable reports whether the runsc runtime can be tested here.
// Until the runsc runtime lands, only libcontainer is in the table.
func runscAvailable(t *testing.T) bool { return false }

func runscAvailableB() bool { return false }
