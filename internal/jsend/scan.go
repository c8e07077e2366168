package jsend

import "errors"

// A scanner of JSON text that allocates nothing: it finds where values
// end and counts them, so that a body from someone untrusted (a guest's
// answer, a large request) can be bounded before anything is decoded
// from it. encoding/json decodes first and counts after: a list of a
// million empty objects is a million structures before its length can
// be checked.

// errScan is JSON the scanner cannot walk. Callers that need to say why
// check the text with json.Valid first.
var errScan = errors.New("jsend: malformed JSON")

// maxScanDepth is encoding/json's limit on nesting: deeper text is
// refused by the decoder too.
const maxScanDepth = 10000

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\r' || c == '\n' }

// skipSpace returns the index of the first byte at or after i that is
// not whitespace.
func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// stringEnd returns the index just after the string that opens at b[i]
// (a '"'), or -1 when it is not closed.
func stringEnd(b []byte, i int) int {
	for j := i + 1; j < len(b); j++ {
		switch b[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// valueEnd returns the index just after the value that starts at b[i]
// (no whitespace before it), or -1 when it is malformed in a way the
// scanner sees: an unclosed string or container, nesting deeper than
// maxScanDepth, a bracket that does not match. It does not check
// numbers, literals or escapes: json.Valid does.
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return -1
	}
	switch b[i] {
	case '"':
		return stringEnd(b, i)
	case '{', '[':
		// Only the depth is kept (a stack of the open brackets would cost
		// memory the input chooses), so only the outermost pair is
		// matched; json.Valid is the full check.
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				end := stringEnd(b, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
				if depth > maxScanDepth {
					return -1
				}
			case '}', ']':
				depth--
				if depth == 0 {
					if (b[i] == '{') != (b[j] == '}') {
						return -1
					}
					return j + 1
				}
			}
		}
		return -1
	default:
		j := i
		for j < len(b) && !isDelim(b[j]) {
			j++
		}
		if j == i {
			return -1
		}
		return j
	}
}

// isDelim tells whether c ends a number or a literal.
func isDelim(c byte) bool {
	switch c {
	case ' ', '\t', '\r', '\n', ',', ':', '[', ']', '{', '}', '"':
		return true
	}
	return false
}

// EachMember calls f with the raw key (quotes included) and raw value of
// each member of the JSON object obj, in order, until f fails; it
// allocates nothing, as EachElement.
func EachMember(obj []byte, f func(key, value []byte) error) error {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return errScan
	}
	i = skipSpace(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return nil
	}
	for {
		if i >= len(obj) || obj[i] != '"' {
			return errScan
		}
		kend := stringEnd(obj, i)
		if kend < 0 {
			return errScan
		}
		key := obj[i:kend]
		i = skipSpace(obj, kend)
		if i >= len(obj) || obj[i] != ':' {
			return errScan
		}
		i = skipSpace(obj, i+1)
		vend := valueEnd(obj, i)
		if vend < 0 {
			return errScan
		}
		if err := f(key, obj[i:vend]); err != nil {
			return err
		}
		i = skipSpace(obj, vend)
		if i >= len(obj) {
			return errScan
		}
		switch obj[i] {
		case ',':
			i = skipSpace(obj, i+1)
		case '}':
			return nil
		default:
			return errScan
		}
	}
}

// EachElement calls f with each element of the JSON array arr, raw and
// in order, until f fails; it allocates nothing, so a caller can bound
// how many elements it takes before it decodes any. arr must be one
// array with nothing around it but whitespace; a caller that must tell
// malformed text from a refusal of f checks it with json.Valid first.
func EachElement(arr []byte, f func(elem []byte) error) error {
	i := skipSpace(arr, 0)
	if i >= len(arr) || arr[i] != '[' {
		return errScan
	}
	if end := valueEnd(arr, i); end < 0 || skipSpace(arr, end) != len(arr) {
		return errScan
	}
	i = skipSpace(arr, i+1)
	if i < len(arr) && arr[i] == ']' {
		return nil
	}
	for {
		end := valueEnd(arr, i)
		if end < 0 {
			return errScan
		}
		if err := f(arr[i:end]); err != nil {
			return err
		}
		i = skipSpace(arr, end)
		if i >= len(arr) {
			return errScan
		}
		switch arr[i] {
		case ',':
			i = skipSpace(arr, i+1)
		case ']':
			return nil
		default:
			return errScan
		}
	}
}

// countValues counts the values of the JSON text body (objects, arrays
// and scalars; an object's keys are not values), stopping once it has
// passed max: what it returns is at most max+1. It trusts nothing and
// allocates nothing; on malformed text its count is of no use, and the
// decoder refuses that text anyway.
func countValues(body []byte, max int) int {
	n := 0
	for i := 0; i < len(body) && n <= max; i++ {
		switch c := body[i]; {
		case isSpace(c) || c == ',' || c == ':' || c == ']' || c == '}':
		case c == '{' || c == '[':
			n++
		case c == '"':
			end := stringEnd(body, i)
			if end < 0 {
				return n + 1
			}
			// A string followed by a colon is a key.
			if j := skipSpace(body, end); j >= len(body) || body[j] != ':' {
				n++
			}
			i = end - 1
		default:
			n++
			for i+1 < len(body) && !isDelim(body[i+1]) {
				i++
			}
		}
	}
	return n
}
