package api

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"

	"strata/internal/fault"
)

// hidden lists, by hand, the characters that defect 7 of issue 6 names:
// names accepted bidi overrides, zero-width and line separator characters.
// The fuzz target and the table check against this list as well as against
// the Unicode categories, so that neither a table of Go's unicode package
// nor HiddenRune can drift without a test noticing.
var hidden = []rune{
	0x00, 0x07, '\t', '\n', '\r', 0x1b, 0x7f, 0x85, 0x9f, // Cc
	0x00ad,                                 // soft hyphen
	0x061c,                                 // Arabic letter mark
	0x180e,                                 // Mongolian vowel separator
	0x200b, 0x200c, 0x200d, 0x200e, 0x200f, // zero-width space, non-joiner, joiner; LRM, RLM
	0x202a, 0x202b, 0x202c, 0x202d, 0x202e, // LRE, RLE, PDF, LRO, RLO
	0x2060, 0x2061, 0x2064, // word joiner, invisible operators
	0x2066, 0x2067, 0x2068, 0x2069, // LRI, RLI, FSI, PDI
	0x2028, 0x2029, // line, paragraph separator
	0xfeff,         // byte order mark, zero-width no-break space
	0xfff9, 0xfffb, // interlinear annotation
	0xe0001, 0xe0041, // language tag, tag letter
}

// refused is the rule as the contract states it, written apart from
// HiddenRune: invalid UTF-8, over 128 bytes, or any character of category
// Cc, Cf, Zl or Zp, or of the hand-made list.
func refused(name string) bool {
	if len(name) > MaxNameBytes || !utf8.ValidString(name) {
		return true
	}
	for _, r := range name {
		if unicode.Is(unicode.Cc, r) || unicode.Is(unicode.Cf, r) || unicode.Is(unicode.Zl, r) || unicode.Is(unicode.Zp, r) {
			return true
		}
		for _, h := range hidden {
			if r == h {
				return true
			}
		}
	}
	return false
}

// FuzzValidateName checks ValidateName against the rule on any string: a
// name it accepts is valid UTF-8 of at most 128 bytes with no control,
// format (zero-width, bidi) or line/paragraph separator character; a name
// it refuses breaks that rule, and is refused with invalid_field naming the
// field "name".
func FuzzValidateName(f *testing.F) {
	for _, seed := range []string{
		"", "before-update", "répertoire", "日本語の名前", "emoji 😀", "a b",
		"a\nb", "a\u202eb", "\u2066x\u2069", "zero\u200bwidth", "\ufeffbom", "line\u2028sep", "para\u2029sep",
		"\xff", "a\xe2\x82", "\xed\xa0\x80", strings.Repeat("é", 64), strings.Repeat("é", 65),
		strings.Repeat("n", 128), strings.Repeat("n", 129), "tag\U000e0041", "soft\u00adhyphen",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := ValidateName(name)
		if err == nil {
			if refused(name) {
				t.Fatalf("accepted %+q", name)
			}
			return
		}
		if !refused(name) {
			t.Fatalf("refused %+q: %v", name, err)
		}
		fe := fault.As(err)
		if fe == nil || fe.Code != "invalid_field" || fe.Kind != fault.Invalid || fe.Fields["field"] != "name" {
			t.Fatalf("refused %+q with %v, want invalid_field naming name", name, err)
		}
	})
}

// TestValidateName pins defect 7 of issue 6: names accepted bidi overrides
// (U+202E), zero-width and line separator characters, which make one
// name look like another in a list, a log or a terminal.
func TestValidateName(t *testing.T) {
	tests := []struct {
		name, in  string
		character string // the character the error names; "" for none
		ok        bool
	}{
		{"plain", "before-update", "", true},
		{"empty", "", "", true},
		{"accents and CJK", "répertoire 日本語", "", true},
		{"emoji with a variation selector", "\u2764\ufe0f done", "", true},
		{"combining mark", "e\u0301", "", true},
		{"spaces", "a b\u00a0c\u3000d", "", true},
		{"replacement character", "\ufffd", "", true},
		{"128 bytes", strings.Repeat("n", 128), "", true},
		{"129 bytes", strings.Repeat("n", 129), "", false},
		{"newline", "a\nb", "U+000A", false},
		{"NUL", "a\x00b", "U+0000", false},
		{"DEL", "a\x7fb", "U+007F", false},
		{"C1 control", "a\u0085b", "U+0085", false},
		{"right-to-left override", "invoice\u202egpj.exe", "U+202E", false},
		{"left-to-right isolate", "\u2066name", "U+2066", false},
		{"pop directional isolate", "name\u2069", "U+2069", false},
		{"zero-width space", "zero\u200bwidth", "U+200B", false},
		{"zero-width joiner", "a\u200db", "U+200D", false},
		{"right-to-left mark", "a\u200fb", "U+200F", false},
		{"byte order mark", "\ufeffname", "U+FEFF", false},
		{"line separator", "line\u2028two", "U+2028", false},
		{"paragraph separator", "para\u2029two", "U+2029", false},
		{"invalid UTF-8", "bad\xff", "", false},
		{"encoded surrogate", "\xed\xa0\x80", "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateName(tc.in)
			if (err == nil) != tc.ok {
				t.Fatalf("ValidateName(%+q) = %v, want ok %v", tc.in, err, tc.ok)
			}
			if refused(tc.in) == tc.ok {
				t.Fatalf("the table and the rule disagree on %+q", tc.in)
			}
			if err == nil {
				return
			}
			fe := fault.As(err)
			if fe == nil || fe.Code != "invalid_field" || fe.Fields["field"] != "name" {
				t.Fatalf("error %v, want invalid_field naming name", err)
			}
			if tc.character != "" && fe.Fields["character"] != tc.character {
				t.Errorf("character %v, want %s", fe.Fields["character"], tc.character)
			}
		})
	}
	for _, r := range hidden {
		if !HiddenRune(r) {
			t.Errorf("HiddenRune(%U) = false", r)
		}
	}
}

// TestCreateRequestValidate: the path gets the name's character rule
// (defect 7 of issue 6): a path holding a bidi override or a line separator
// is invalid_field naming "path", before the guest's path policy sees it.
func TestCreateRequestValidate(t *testing.T) {
	str := func(s string) *string { return &s }
	tests := []struct {
		name      string
		req       CreateRequest
		field     string // the field the error names; "" when accepted
		character string
	}{
		{"path and name", CreateRequest{Path: str("/workspace/project"), Name: str("first")}, "", ""},
		{"no name", CreateRequest{Path: str("/workspace/project")}, "", ""},
		{"unicode path", CreateRequest{Path: str("/home/ü/δ")}, "", ""},
		{"no path", CreateRequest{Name: str("x")}, "path", ""},
		{"empty path", CreateRequest{Path: str("")}, "path", ""},
		{"bidi override in path", CreateRequest{Path: str("/workspace/\u202etcejorp")}, "path", "U+202E"},
		{"newline in path", CreateRequest{Path: str("/workspace/a\nb")}, "path", "U+000A"},
		{"NUL in path", CreateRequest{Path: str("/workspace/a\x00b")}, "path", "U+0000"},
		{"line separator in path", CreateRequest{Path: str("/workspace/a\u2028b")}, "path", "U+2028"},
		{"zero-width space in path", CreateRequest{Path: str("/workspace/\u200bproject")}, "path", "U+200B"},
		{"invalid UTF-8 in path", CreateRequest{Path: str("/workspace/\xff")}, "path", ""},
		{"bad name", CreateRequest{Path: str("/workspace/project"), Name: str("a\u2066b")}, "name", "U+2066"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p, n, err := tc.req.Validate()
			if tc.field == "" {
				if err != nil || p != *tc.req.Path || (tc.req.Name != nil && n != *tc.req.Name) {
					t.Fatalf("Validate = %q, %q, %v", p, n, err)
				}
				return
			}
			fe := fault.As(err)
			if fe == nil || fe.Code != "invalid_field" || fe.Fields["field"] != tc.field {
				t.Fatalf("error %v, want invalid_field naming %s", err, tc.field)
			}
			if tc.character != "" && fe.Fields["character"] != tc.character {
				t.Errorf("character %v, want %s", fe.Fields["character"], tc.character)
			}
		})
	}
}

// FuzzIdempotencyKey checks the Idempotency-Key rule on any value, sent
// once or twice: a key is accepted exactly when it is sent once and is 1
// to 255 printable ASCII characters, comes back unchanged, and anything
// else is invalid_field naming the header.
func FuzzIdempotencyKey(f *testing.F) {
	for _, seed := range []string{"", "retry-1", "a b", "\x7f", "é", "k\x00", strings.Repeat("k", 255), strings.Repeat("k", 256)} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	f.Fuzz(func(t *testing.T, key string, twice bool) {
		values := []string{key}
		if twice {
			values = append(values, key)
		}
		got, err := IdempotencyKey(values)
		valid := !twice && len(key) >= 1 && len(key) <= 255
		for _, c := range []byte(key) {
			valid = valid && c >= ' ' && c <= '~'
		}
		if valid {
			if err != nil || got != key {
				t.Fatalf("IdempotencyKey(%+q) = %+q, %v", values, got, err)
			}
			return
		}
		fe := fault.As(err)
		if got != "" || fe == nil || fe.Code != "invalid_field" || fe.Fields["field"] != HeaderIdempotencyKey {
			t.Fatalf("IdempotencyKey(%+q) = %+q, %v; want invalid_field naming Idempotency-Key", values, got, err)
		}
	})
}

// TestIdempotencyKey: the header of create and restore (issue 6): absent
// is no key; present, it is 1 to 255 printable ASCII characters sent once.
func TestIdempotencyKey(t *testing.T) {
	tests := []struct {
		name   string
		values []string
		want   string
		ok     bool
	}{
		{"absent", nil, "", true},
		{"uuid", []string{"3f2b8c1e-9d4a-4e6b-8f0a-1c2d3e4f5a6b"}, "3f2b8c1e-9d4a-4e6b-8f0a-1c2d3e4f5a6b", true},
		{"one character", []string{"k"}, "k", true},
		{"every printable", []string{" !~azAZ09"}, " !~azAZ09", true},
		{"255 characters", []string{strings.Repeat("k", 255)}, strings.Repeat("k", 255), true},
		{"empty", []string{""}, "", false},
		{"256 characters", []string{strings.Repeat("k", 256)}, "", false},
		{"tab", []string{"a\tb"}, "", false},
		{"DEL", []string{"a\x7fb"}, "", false},
		{"non-ASCII", []string{"clé"}, "", false},
		{"twice, the same", []string{"k", "k"}, "", false},
		{"twice, different", []string{"k", "l"}, "", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := IdempotencyKey(tc.values)
			if tc.ok {
				if err != nil || got != tc.want {
					t.Fatalf("got %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			fe := fault.As(err)
			if fe == nil || fe.Code != "invalid_field" || fe.Fields["field"] != "Idempotency-Key" {
				t.Fatalf("got %q, %v; want invalid_field naming Idempotency-Key", got, err)
			}
		})
	}
}

// FuzzValidTokenSHA256 checks the shape of Credentials.TokenSHA256 on
// any string: exactly what hex.EncodeToString makes of 32 bytes (64
// lowercase hex digits), as hostproxy's registry stores a token's hash.
func FuzzValidTokenSHA256(f *testing.F) {
	sum := sha256.Sum256([]byte("sbt_x"))
	good := hex.EncodeToString(sum[:])
	for _, s := range []string{good, strings.ToUpper(good), good[:63], good + "0", "", good[:63] + "g", good[:62] + "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b, err := hex.DecodeString(s)
		want := err == nil && len(b) == sha256.Size && hex.EncodeToString(b) == s
		if got := ValidTokenSHA256(s); got != want {
			t.Fatalf("ValidTokenSHA256(%q) = %v, want %v", s, got, want)
		}
	})
}
