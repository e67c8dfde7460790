package routing

// Rendezvous returns the index of the dial with the highest random weight
// for key (highest-random-weight hashing): the same key always maps to the
// same dial; removing a dial remaps only the keys that were on it, and
// adding one moves about 1/n of the keys, all onto the new dial. It returns
// -1 when dials is empty. With duplicate dials the first one wins.
func Rendezvous(key string, dials []string) int {
	return rendezvousIndex(mix64(hashString(key)), dials)
}

func rendezvousIndex(key uint64, dials []string) int {
	best, bestW := -1, uint64(0)
	for i, d := range dials {
		if w := hrwWeight(key, hashString(d)); best < 0 || w > bestW {
			best, bestW = i, w
		}
	}
	return best
}

// hrwWeight is the rendezvous weight of a (key, dial) pair. Both are mixed
// so that weights of one key over different dials, and of one dial over
// nearby keys, behave as independent uniform values.
func hrwWeight(key, dialHash uint64) uint64 {
	return mix64(key ^ mix64(dialHash+0x9e3779b97f4a7c15))
}

// hashString is 64-bit FNV-1a; cheap, allocation-free and good enough once
// its output is passed through mix64.
func hashString(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= 1099511628211
	}
	return h
}

// mix64 is the SplitMix64 finaliser: a bijection with full avalanche.
func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}
