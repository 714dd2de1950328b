package allocwatch

// The scanner behind leanAllocList: it reads the node's allocation list as
// it streams in, checks all of it as JSON, and keeps, of each allocation,
// only the members that could land in a leanAlloc field. Everything else
// (each allocation's job, its tasks' events, most of it) is checked as
// encoding/json checks it and dropped byte by byte, without building a
// value from it.

import (
	"bufio"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"
	"unicode/utf8"
)

// maxDepth is how deep arrays and objects may nest, as in encoding/json.
const maxDepth = 10000

// shape says what of a JSON value is kept: nil drops it (it is only
// checked), all keeps it whole; otherwise an object keeps the members that
// may land in one of fields (a struct) or every member with elem (a map or
// a slice), and an array keeps every element with elem (an array where a
// struct is expected is kept whole). A scalar is kept as it is. Where the
// kind does not match the type (an object for a slice, an array for a
// map), json.Unmarshal refuses what is kept as it would have refused the
// whole.
type shape struct {
	all    bool
	fields map[string]*shape // a struct's fields, by name in lower case
	elem   *shape            // a map's values, a slice's elements
}

var keepAll = &shape{all: true}

// leanShape is what of an allocation is kept: leanAlloc's fields, and in
// them only what their types hold.
var leanShape = shapeOf(reflect.TypeFor[leanAlloc]())

// shapeOf derives the shape of what json.Unmarshal can put into a value of
// type t. A type that decodes itself (time.Time) is kept whole.
func shapeOf(t reflect.Type) *shape {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	pt := reflect.PointerTo(t)
	if pt.Implements(reflect.TypeFor[json.Unmarshaler]()) || pt.Implements(reflect.TypeFor[encoding.TextUnmarshaler]()) {
		return keepAll
	}
	switch t.Kind() {
	case reflect.Struct:
		sh := &shape{fields: map[string]*shape{}}
		for i := range t.NumField() {
			f := t.Field(i)
			if f.Tag.Get("json") != "" || !f.IsExported() || f.Anonymous || !ascii(f.Name) {
				// Not the plain fields member matches (a name outside
				// ASCII folds as encoding/json folds it, not as
				// ToLower does): kept whole.
				return keepAll
			}
			sh.fields[strings.ToLower(f.Name)] = shapeOf(f.Type)
		}
		return sh
	case reflect.Map, reflect.Slice:
		return &shape{elem: shapeOf(t.Elem())}
	}
	return keepAll
}

func ascii(name string) bool {
	for i := range len(name) {
		if name[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// member returns the shape of the member named by the raw JSON string key
// (quotes included) of an object of shape sh. encoding/json matches member
// names to fields without regard to case (Unicode folding included): a key
// that holds an escape or a byte outside ASCII is kept whole, since
// keeping more than needed changes nothing (json.Unmarshal then decides
// exactly as it would have on the whole allocation).
func (sh *shape) member(key []byte) *shape {
	if sh.fields == nil {
		return sh.elem
	}
	name := key[1 : len(key)-1]
	var lower [32]byte
	if len(name) > len(lower) {
		return keepAll // longer than any field's name, unless escaped
	}
	for i, b := range name {
		if b == '\\' || b >= utf8.RuneSelf {
			return keepAll
		}
		if 'A' <= b && b <= 'Z' {
			b += 'a' - 'A'
		}
		lower[i] = b
	}
	return sh.fields[string(lower[:len(name)])] // no allocation: a map index
}

// scanner reads JSON from r. Values are checked as encoding/json checks
// them; a kept value's bytes are appended to out as they are read.
type scanner struct {
	r     *bufio.Reader
	out   []byte // the kept bytes of the element being read
	depth int
}

var errCut = errors.New("unexpected end of JSON input")

// byte reads the next byte; the end of the input is errCut.
func (s *scanner) byte() (byte, error) {
	c, err := s.r.ReadByte()
	if errors.Is(err, io.EOF) {
		return 0, errCut
	}
	return c, err
}

// nonSpace reads up to the next byte that is not JSON white space.
func (s *scanner) nonSpace() (byte, error) {
	for {
		c, err := s.byte()
		if err != nil {
			return 0, err
		}
		if c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return c, nil
		}
	}
}

func (s *scanner) put(keep bool, c byte) {
	if keep {
		s.out = append(s.out, c)
	}
}

// value reads the rest of one JSON value, whose first byte c has been
// read, and appends to out what sh keeps of it.
func (s *scanner) value(c byte, sh *shape) error {
	keep := sh != nil
	switch {
	case c == '{':
		return s.object(sh)
	case c == '[':
		return s.array(sh)
	case c == '"':
		s.put(keep, c)
		return s.str(keep)
	case c == 't':
		return s.literal("true", keep)
	case c == 'f':
		return s.literal("false", keep)
	case c == 'n':
		return s.literal("null", keep)
	case c == '-' || '0' <= c && c <= '9':
		return s.number(c, keep)
	}
	return fmt.Errorf("invalid character %q looking for the beginning of a value", c)
}

func (s *scanner) nest() error {
	if s.depth++; s.depth > maxDepth {
		return fmt.Errorf("nested deeper than %d", maxDepth)
	}
	return nil
}

// object reads the rest of an object whose '{' has been read, keeping what
// sh keeps of it: each kept member with its shape (see shape.member).
func (s *scanner) object(sh *shape) error {
	if err := s.nest(); err != nil {
		return err
	}
	keep := sh != nil
	s.put(keep, '{')
	kept := 0 // members written to out
	c, err := s.nonSpace()
	if err != nil {
		return err
	}
	for n := 0; ; n++ {
		if c == '}' && n == 0 {
			break
		}
		if c != '"' {
			return fmt.Errorf("invalid character %q looking for the beginning of an object key", c)
		}
		mark := len(s.out)
		if keep && kept > 0 {
			s.out = append(s.out, ',')
		}
		keyAt := len(s.out)
		s.put(keep, c)
		if err := s.str(keep); err != nil {
			return err
		}
		var msh *shape
		switch {
		case sh == nil:
		case sh.all:
			msh = keepAll
		default:
			msh = sh.member(s.out[keyAt:])
		}
		if c, err = s.nonSpace(); err != nil {
			return err
		}
		if c != ':' {
			return fmt.Errorf("invalid character %q after an object key", c)
		}
		s.put(keep, c)
		if c, err = s.nonSpace(); err != nil {
			return err
		}
		if err := s.value(c, msh); err != nil {
			return err
		}
		switch {
		case msh != nil:
			kept++
		case keep:
			s.out = s.out[:mark] // a member this shape drops
		}
		if c, err = s.nonSpace(); err != nil {
			return err
		}
		if c == '}' {
			break
		}
		if c != ',' {
			return fmt.Errorf("invalid character %q after an object member", c)
		}
		if c, err = s.nonSpace(); err != nil {
			return err
		}
	}
	s.put(keep, '}')
	s.depth--
	return nil
}

// array reads the rest of an array whose '[' has been read, keeping what
// sh keeps of each element.
func (s *scanner) array(sh *shape) error {
	if err := s.nest(); err != nil {
		return err
	}
	keep := sh != nil
	esh := sh
	if sh != nil && !sh.all {
		esh = sh.elem
		if esh == nil { // a struct's shape: an array is not one; keep it whole
			esh = keepAll
		}
	}
	s.put(keep, '[')
	c, err := s.nonSpace()
	if err != nil {
		return err
	}
	for n := 0; ; n++ {
		if c == ']' && n == 0 {
			break
		}
		if err := s.value(c, esh); err != nil {
			return err
		}
		if c, err = s.nonSpace(); err != nil {
			return err
		}
		if c == ']' {
			break
		}
		if c != ',' {
			return fmt.Errorf("invalid character %q after an array element", c)
		}
		s.put(keep, c)
		if c, err = s.nonSpace(); err != nil {
			return err
		}
	}
	s.put(keep, ']')
	s.depth--
	return nil
}

// str reads the rest of a string whose opening quote has been read: every
// escape must be one of JSON's, and no byte may be a control character.
func (s *scanner) str(keep bool) error {
	for {
		// The plain bytes in the reader's buffer, in one go.
		if _, err := s.r.Peek(1); err != nil {
			if errors.Is(err, io.EOF) {
				return errCut
			}
			return err
		}
		buf, _ := s.r.Peek(s.r.Buffered())
		i := 0
		for i < len(buf) && !strStop[buf[i]] {
			i++
		}
		if keep {
			s.out = append(s.out, buf[:i]...)
		}
		_, _ = s.r.Discard(i) // buffered: cannot fail
		if i == len(buf) {
			continue
		}
		c, err := s.byte()
		if err != nil {
			return err
		}
		s.put(keep, c)
		switch {
		case c == '"':
			return nil
		case c < 0x20:
			return fmt.Errorf("invalid character %q in a string", c)
		case c == '\\':
			e, err := s.byte()
			if err != nil {
				return err
			}
			s.put(keep, e)
			switch e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
			case 'u':
				for range 4 {
					h, err := s.byte()
					if err != nil {
						return err
					}
					if !('0' <= h && h <= '9' || 'a' <= h && h <= 'f' || 'A' <= h && h <= 'F') {
						return fmt.Errorf("invalid character %q in a \\u escape", h)
					}
					s.put(keep, h)
				}
			default:
				return fmt.Errorf("invalid escape %q in a string", e)
			}
		}
	}
}

// strStop marks the bytes that end a string's run of plain bytes: the
// closing quote, an escape, a control character.
var strStop = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// literal reads the rest of true, false or null, whose first byte has
// been read.
func (s *scanner) literal(word string, keep bool) error {
	s.put(keep, word[0])
	for i := 1; i < len(word); i++ {
		c, err := s.byte()
		if err != nil {
			return err
		}
		if c != word[i] {
			return fmt.Errorf("invalid character %q in literal %s", c, word)
		}
		s.put(keep, c)
	}
	return nil
}

// number reads the rest of a number whose first byte c has been read,
// by JSON's grammar: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?. The
// byte after it is left unread.
func (s *scanner) number(c byte, keep bool) error {
	s.put(keep, c)
	if c == '-' {
		var err error
		if c, err = s.byte(); err != nil {
			return err
		}
		if !isDigit(c) {
			return fmt.Errorf("invalid character %q in a number", c)
		}
		s.put(keep, c)
	}
	// The integer part: a lone 0, or digits not starting with 0.
	if c != '0' {
		if err := s.digits(keep, false); err != nil {
			return err
		}
	}
	c, err := s.r.ReadByte()
	if errors.Is(err, io.EOF) {
		return nil
	}
	if err != nil {
		return err
	}
	if c == '.' {
		s.put(keep, c)
		if err := s.digits(keep, true); err != nil {
			return err
		}
		if c, err = s.r.ReadByte(); errors.Is(err, io.EOF) {
			return nil
		} else if err != nil {
			return err
		}
	}
	if c == 'e' || c == 'E' {
		s.put(keep, c)
		if c, err = s.byte(); err != nil {
			return err
		}
		if c == '+' || c == '-' {
			s.put(keep, c)
		} else if err := s.r.UnreadByte(); err != nil {
			return err
		}
		if err := s.digits(keep, true); err != nil {
			return err
		}
		return nil
	}
	return s.r.UnreadByte() // c is not part of the number
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// digits reads a run of digits, at least one when one is true, and leaves
// the byte after them unread.
func (s *scanner) digits(keep, one bool) error {
	for n := 0; ; n++ {
		c, err := s.r.ReadByte()
		if errors.Is(err, io.EOF) {
			if one && n == 0 {
				return errCut
			}
			return nil
		}
		if err != nil {
			return err
		}
		if !isDigit(c) {
			if one && n == 0 {
				return fmt.Errorf("invalid character %q in a number", c)
			}
			return s.r.UnreadByte()
		}
		s.put(keep, c)
	}
}

// element reads the rest of one allocation, whose '{' has been read, and
// decodes what leanShape keeps of it (in its order, so that a member
// given twice ends as encoding/json would end it) into a leanAlloc.
func (s *scanner) element() (*leanAlloc, error) {
	s.out = s.out[:0]
	if err := s.object(leanShape); err != nil {
		return nil, err
	}
	var a leanAlloc
	if err := json.Unmarshal(s.out, &a); err != nil {
		return nil, err
	}
	return &a, nil
}
