package jsonlex

// Skip validates the value that starts at b[i] (after any whitespace) and
// returns the cursor after it. depth containers are open around it
// already; one nested deeper than max is an error. It walks nested values
// with a stack of bits (object or array, by level) rather than recursion,
// so a deep limit costs no goroutine stack.
func Skip(b []byte, i, depth, max int) (int, error) {
	var inline [2]uint64
	objs := inline[:]
	n := 0 // containers opened by this skip
	for {
		i = SkipSpace(b, i)
		var err error
		switch c := byte(0); {
		case i >= len(b):
			return i, Unexpected(b, i, "looking for beginning of value")
		case b[i] == '{' || b[i] == '[':
			c = b[i]
			if depth+n+1 > max {
				return i, DepthError(i, max)
			}
			if n/64 == len(objs) {
				objs = append(objs, 0)
			}
			objs[n/64] &^= 1 << (n % 64)
			if c == '{' {
				objs[n/64] |= 1 << (n % 64)
			}
			n++
			if i = SkipSpace(b, i+1); i < len(b) && b[i] == c+2 { // '{'+2 is '}', '['+2 is ']'
				i++
				n--
				break
			}
			if c == '{' {
				if i, err = ObjectKey(b, i); err != nil {
					return i, err
				}
			}
			continue
		default:
			if i, err = scalar(b, i); err != nil {
				return i, err
			}
		}
		if n, i, err = closeContainers(b, i, objs, n); err != nil || n == 0 {
			return i, err
		}
	}
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
		i = SkipSpace(b, i)
		obj := objs[(n-1)/64]&(1<<((n-1)%64)) != 0
		switch c := byte(0); {
		case i < len(b) && b[i] == ',':
			if obj {
				i, err := ObjectKey(b, i+1)
				return n, i, err
			}
			return n, i + 1, nil
		case i < len(b):
			c = b[i]
			if obj && c == '}' || !obj && c == ']' {
				i++
				n--
				continue
			}
		}
		if obj {
			return n, i, Unexpected(b, i, "after object key:value pair")
		}
		return n, i, Unexpected(b, i, "after array element")
	}
	return 0, i, nil
}

// ObjectKey reads an object's key and the colon after it, from b[i]
// (after any whitespace), and returns the key and the cursor after the
// colon.
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
