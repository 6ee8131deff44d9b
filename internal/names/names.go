// Package names measures how far a name is from another, for the
// "did you mean" of a misspelt argument or variable.
package names

// Distance is the Levenshtein distance of a and b, in bytes. Names longer
// than 64 bytes are too far from any known one to be worth measuring (and
// a caller's input may be long): their distance is the longer length.
func Distance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return max(len(a), len(b))
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
