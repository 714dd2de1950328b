package zfs

import (
	"bytes"
	"fmt"
	"sort"
	"strings"
)

// ParseGet parses the output of
//
//	zfs get -H -p -o name,property,value,source PROPS NAME...
//
// where props is PROPS in the order given. It returns one Dataset per name,
// sorted by name; snapshots (names with "@") are dropped, since zfs-fuse has
// no `get -t` and `get -r` lists them too.
//
// zfs prints, for each dataset, one line per requested property in the
// requested order: name, property, value and source separated by TABs.
// Names, property names and sources never hold a TAB or a newline; a value
// may hold both (user properties are free text). So:
//
//   - A line with more than four fields is one record whose value holds
//     TABs: the name is the first field, the property the second, the source
//     the last, and the value everything between, recovered exactly.
//   - A value with a newline splits its record over several lines, and its
//     text may imitate records, even whole blocks of other datasets. The
//     parser follows the structure: a line that is not a record of a
//     plausible dataset name and a requested property, a property out of
//     order, a block left incomplete, or a dataset that shows up in two
//     separate blocks makes that dataset's Err non-nil. So does every block
//     that begins while such a dataset's own lines have not resumed, and
//     every block that lies between two blocks of one dataset (from the
//     first of its blocks that can be real: with "name" last, a real block
//     begins right after a clean "name" record): those may be forged.
//
// A dataset with a bad value therefore never stops the others from being
// read. One forgery stays invisible to the structure: a complete block
// placed inside the value of the *last* property of a block. The caller
// closes that door by asking for a property whose value cannot hold a
// newline last; Client.get asks for "name" last, and ParseGet checks that a
// "name" record holds the dataset's own name.
//
// The error is non-nil only when props is empty or the output does not
// start with a record (then it is not `zfs get` output at all).
func ParseGet(out []byte, props []string) ([]Dataset, error) {
	if len(props) == 0 {
		return nil, fmt.Errorf("parsing zfs get output: no properties given")
	}
	p := &getParser{
		props:    props,
		sentinel: props[len(props)-1] == "name",
		sets:     make(map[string]*Dataset),
		blocksOf: make(map[string][]int),
		pending:  make(map[string]int),
		cur:      -1,
	}
	lines := bytes.Split(out, []byte("\n"))
	if n := len(lines); n > 0 && len(lines[n-1]) == 0 {
		lines = lines[:n-1] // the newline that ends the last record
	}
	for i, line := range lines {
		if err := p.line(i+1, string(line)); err != nil {
			return nil, err
		}
	}
	if b := p.current(); b != nil && b.next < len(props) {
		p.bad(b.name, "its block is incomplete at the end of the output (%d of %d properties)", b.next, len(props))
	}

	names := make([]string, 0, len(p.sets))
	for n := range p.sets {
		if !strings.Contains(n, "@") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	res := make([]Dataset, 0, len(names))
	for _, n := range names {
		res = append(res, *p.sets[n])
	}
	return res, nil
}

// getParser holds the state of one ParseGet.
type getParser struct {
	props []string
	// sentinel: the last property is "name", whose value cannot hold a
	// newline, so every real block ends with a clean "name" record.
	sentinel bool
	sets     map[string]*Dataset
	blocks   []getBlock
	// blocksOf lists the indexes in blocks of each dataset's blocks.
	blocksOf map[string][]int
	// prevNameOK: the previous line was a complete "name" record holding
	// its own dataset's name, as the last line of every real block is.
	prevNameOK bool
	// pending holds the datasets that had an anomaly and whose own lines
	// have not resumed since, with the output line of the anomaly: a block
	// that begins while any is pending may be text of their values.
	pending map[string]int
	cur     int // index in blocks of the block being read; -1 before the first
}

// getBlock is one run of consecutive lines of one dataset.
type getBlock struct {
	name  string
	start int // output line where it began
	next  int // index in props of the next property expected
	// couldBeReal is false when the block certainly began inside a value:
	// with the "name" sentinel, a real block begins at the first line or
	// right after a clean "name" record.
	couldBeReal bool
}

func (p *getParser) current() *getBlock {
	if p.cur < 0 || p.cur >= len(p.blocks) {
		return nil
	}
	return &p.blocks[p.cur]
}

// line handles one output line (lineNo counts from 1).
func (p *getParser) line(lineNo int, line string) error {
	f := strings.Split(line, "\t")
	// A record begins with name<TAB>property<TAB>; with exactly three
	// fields its value goes on past a newline and its source is missing.
	if len(f) < 3 || !plausibleName(f[0]) || !p.requested(f[1]) {
		cur := p.current()
		if cur == nil {
			return fmt.Errorf("%w: zfs get output line %d is not a name<TAB>property<TAB>value<TAB>source record of a requested property: %q",
				ErrMalformed, lineNo, truncate(line))
		}
		p.bad(cur.name, "output line %d is not a name<TAB>property<TAB>value<TAB>source record of a requested property (a value with a newline?)", lineNo)
		p.suspend(cur.name, lineNo)
		p.prevNameOK = false
		return nil
	}
	name, prop := f[0], f[1]
	cut := len(f) == 3
	value, source := f[2], ""
	if !cut {
		value, source = strings.Join(f[2:len(f)-1], "\t"), f[len(f)-1]
	}
	p.record(lineNo, name, prop, value, source)
	if cut {
		p.bad(name, "output line %d: the value of %s holds a newline", lineNo, prop)
		p.suspend(name, lineNo)
	}
	if prop == "name" && value != name {
		p.bad(name, "output line %d gives its name property as %q", lineNo, truncate(value))
	}
	p.prevNameOK = !cut && prop == "name" && value == name
	return nil
}

// record places one record into the block structure.
func (p *getParser) record(lineNo int, name, prop, value, source string) {
	defer p.set(name, prop, value, source)
	cur := p.current()
	if cur != nil && cur.name == name && !(cur.next >= len(p.props) && prop == p.props[0]) {
		// The block goes on: the next property, or a later one after lost
		// lines. Either way the dataset's own lines have resumed.
		if cur.next < len(p.props) && p.props[cur.next] == prop {
			cur.next++
		} else {
			p.bad(name, "output line %d holds property %s out of order", lineNo, prop)
			if j := p.indexFrom(prop, cur.next); j >= 0 {
				cur.next = j + 1
			}
		}
		delete(p.pending, name)
		return
	}

	// A new block begins.
	if cur != nil && cur.next < len(p.props) {
		p.bad(cur.name, "its block ends at output line %d after %d of %d properties", lineNo, cur.next, len(p.props))
		p.suspend(cur.name, lineNo)
	}
	p.datasetFor(name)
	earlier := p.blocksOf[name]
	seen := len(earlier) > 0
	if seen {
		p.bad(name, "it appears in two separate blocks of the output (lines %d and %d)", p.blocks[earlier[0]].start, lineNo)
		// Its lines resume here. If one of its earlier blocks is its real
		// one, a value in it may hold everything from there to here: every
		// block in between may be forged. Its lines resuming ends what the
		// anomalies in between can reach.
		from := -1
		for _, i := range earlier {
			if p.blocks[i].couldBeReal {
				from = i
				break
			}
		}
		for i := from + 1; from >= 0 && i < len(p.blocks); i++ {
			if b := p.blocks[i]; b.name != name {
				p.bad(b.name, "its block (output line %d) lies between two blocks of %s", b.start, name)
				delete(p.pending, b.name)
			}
		}
		delete(p.pending, name)
	}
	if susp, at, ok := p.anyPending(); ok {
		p.bad(name, "its block begins at output line %d, after unparseable lines of %s (line %d) and before that dataset's lines resume", lineNo, susp, at)
	}
	next := 1
	if prop != p.props[0] {
		p.bad(name, "its block begins at output line %d with property %s, not %s", lineNo, prop, p.props[0])
		if !seen {
			// Lines of it were lost before this one, in an anomaly that
			// may be text of a value: what follows may be forged too,
			// until its lines resume. (A dataset seen before resumes
			// here; the range above is flagged already.)
			p.suspend(name, lineNo)
		}
		next = p.indexFrom(prop, 0) + 1
	}
	p.blocksOf[name] = append(earlier, len(p.blocks))
	p.blocks = append(p.blocks, getBlock{name: name, start: lineNo, next: next,
		couldBeReal: !p.sentinel || lineNo == 1 || p.prevNameOK})
	p.cur = len(p.blocks) - 1
}

// requested reports whether prop is one of the properties asked for.
func (p *getParser) requested(prop string) bool { return p.indexFrom(prop, 0) >= 0 }

// indexFrom returns the first index >= from of prop in props, or -1.
func (p *getParser) indexFrom(prop string, from int) int {
	for i := from; i < len(p.props); i++ {
		if p.props[i] == prop {
			return i
		}
	}
	return -1
}

func (p *getParser) datasetFor(name string) *Dataset {
	ds, ok := p.sets[name]
	if !ok {
		ds = &Dataset{Name: name, Props: make(map[string]Prop)}
		p.sets[name] = ds
	}
	return ds
}

func (p *getParser) set(name, prop, value, source string) {
	p.datasetFor(name).Props[prop] = Prop{Value: value, Source: source}
}

// bad records the first thing found wrong with a dataset.
func (p *getParser) bad(name, format string, args ...any) {
	ds := p.datasetFor(name)
	if ds.Err == nil {
		ds.Err = fmt.Errorf("%w: zfs get output for %s cannot be trusted: %s", ErrMalformed, name, fmt.Sprintf(format, args...))
	}
}

// suspend records an anomaly of name at lineNo, unless one is pending.
func (p *getParser) suspend(name string, lineNo int) {
	if _, ok := p.pending[name]; !ok {
		p.pending[name] = lineNo
	}
}

// anyPending returns the pending dataset with the earliest anomaly.
func (p *getParser) anyPending() (name string, lineNo int, ok bool) {
	for n, l := range p.pending {
		if !ok || l < lineNo || (l == lineNo && n < name) {
			name, lineNo, ok = n, l, true
		}
	}
	return name, lineNo, ok
}

// plausibleName reports whether s could be a dataset or snapshot name as zfs
// prints it: components of letters, digits and "_-.: " separated by single
// '/', optionally one '@' and a snapshot name, at most 255 bytes.
func plausibleName(s string) bool {
	if s == "" || len(s) > 255 || s[0] == '-' {
		return false
	}
	fs, snap, isSnap := strings.Cut(s, "@")
	if isSnap && (snap == "" || !nameChars(snap)) {
		return false
	}
	for _, comp := range strings.Split(fs, "/") {
		if comp == "" || comp == "." || comp == ".." || !nameChars(comp) {
			return false
		}
	}
	return true
}

// nameChars reports whether s holds only characters zfs allows in a name
// component (OpenZFS allows the space too).
func nameChars(s string) bool {
	for _, r := range s {
		ok := r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			r == '_' || r == '-' || r == '.' || r == ':' || r == ' '
		if !ok {
			return false
		}
	}
	return true
}

// ParseGetExact parses the output of
//
//	zfs get -H -p -o value,source PROP NAME
//
// for one dataset and one property. The source never holds a TAB or a
// newline, so the value is everything before the last TAB (less the newline
// that ends the output), exact even when it holds TABs and newlines.
func ParseGetExact(out []byte) (Prop, error) {
	s, ok := strings.CutSuffix(string(out), "\n")
	if !ok {
		return Prop{}, fmt.Errorf("%w: zfs get -o value,source output does not end with a newline: %q", ErrMalformed, truncate(string(out)))
	}
	i := strings.LastIndexByte(s, '\t')
	if i < 0 {
		return Prop{}, fmt.Errorf("%w: zfs get -o value,source output has no TAB: %q", ErrMalformed, truncate(s))
	}
	value, source := s[:i], s[i+1:]
	if source == "" || strings.ContainsAny(source, "\n\r") {
		return Prop{}, fmt.Errorf("%w: zfs get -o value,source output has no plausible source after its last TAB: %q", ErrMalformed, truncate(source))
	}
	return Prop{Value: value, Source: source}, nil
}

// truncate shortens text quoted in an error.
func truncate(s string) string {
	const max = 120
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
