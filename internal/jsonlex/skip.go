package jsonlex

// Skip validates the value that starts at b[i] (after any whitespace) and
// returns the cursor after it. depth containers are open around it
// already; one nested deeper than max is an error. It walks nested values
// with a stack of bits (object or array, by level) rather than recursion,
// so a deep limit costs no goroutine stack.
func Skip(b []byte, i, depth, max int) (int, error) {
	var inline [2]uint64
	objs := inline[:] // bit k set: the k-th open container is an object
	n := 0            // containers opened by this skip
	for {
		var err error
		if i = SkipSpace(b, i); i >= len(b) {
			return i, Unexpected(b, i, "looking for beginning of value")
		}
		if c := b[i]; c == '{' || c == '[' {
			if depth+n+1 > max {
				return i, DepthError(i, max)
			}
			if i = SkipSpace(b, i+1); i >= len(b) || b[i] != c+2 { // '{'+2 is '}', '['+2 is ']'
				objs = setBit(objs, n, c == '{')
				n++
				if c == '{' {
					if i, err = ObjectKey(b, i); err != nil {
						return i, err
					}
				}
				continue // on to the first member's value
			}
			i++ // an empty container ends like a scalar
		} else if i, err = scalar(b, i); err != nil {
			return i, err
		}
		if n, i, err = closeContainers(b, i, objs, n); err != nil || n == 0 {
			return i, err
		}
	}
}

// setBit sets bit k of bits to v, growing bits by a word when k is past
// its end.
func setBit(bits []uint64, k int, v bool) []uint64 {
	if k/64 == len(bits) {
		bits = append(bits, 0)
	}
	bits[k/64] &^= 1 << (k % 64)
	if v {
		bits[k/64] |= 1 << (k % 64)
	}
	return bits
}

// scalar reads the string, number or literal at b[i].
func scalar(b []byte, i int) (int, error) {
	switch c := b[i]; {
	case c == '"':
		_, end, err := ReadString(b, i)
		return end, err
	case c == '-' || isDigit(c):
		end, _, err := Number(b, i)
		return end, err
	}
	return Literal(b, i)
}

// closeContainers steps past what follows a value inside n open
// containers: the closing brackets of those that end there, then a comma
// (and the next key, in an object). It returns how many stay open; the
// cursor is on the next value unless none do.
func closeContainers(b []byte, i int, objs []uint64, n int) (int, int, error) {
	for n > 0 {
		obj := objs[(n-1)/64]&(1<<((n-1)%64)) != 0
		closing, context := byte(']'), "after array element"
		if obj {
			closing, context = '}', "after object key:value pair"
		}
		switch i = SkipSpace(b, i); {
		case i < len(b) && b[i] == ',':
			if obj {
				i, err := ObjectKey(b, i+1)
				return n, i, err
			}
			return n, i + 1, nil
		case i < len(b) && b[i] == closing:
			i++
			n--
		default:
			return n, i, Unexpected(b, i, context)
		}
	}
	return 0, i, nil
}

// ObjectKey reads an object's key and the colon after it, from b[i]
// (after any whitespace), and returns the cursor after the colon.
func ObjectKey(b []byte, i int) (int, error) {
	_, end, err := Key(b, i)
	return end, err
}

// Key reads an object's key and the colon after it, from b[i] (after any
// whitespace), and returns the key and the cursor after the colon.
func Key(b []byte, i int) (String, int, error) {
	if i = SkipSpace(b, i); i >= len(b) || b[i] != '"' {
		return String{}, i, Unexpected(b, i, "looking for beginning of object key string")
	}
	k, i, err := ReadString(b, i)
	if err != nil {
		return k, i, err
	}
	if i = SkipSpace(b, i); i >= len(b) || b[i] != ':' {
		return k, i, Unexpected(b, i, "after object key")
	}
	return k, i + 1, nil
}
