// Package remotetok is the gateway's client of the engines' /tokenize:
// the token ids of a prompt as the engine renders it, for prompts the
// gateway cannot tokenize itself (package localtok). A [Tokenizer] bounds
// its calls in number, time and answer size, shares identical calls in
// flight, and keeps answers in an LRU cache bounded in entries and bytes,
// with a value derived from the ids (the block keys) beside them.
//
// Calls to http:// engines are made on the caller's goroutine by a small
// HTTP/1.1 client of its own (internal/h1client); https:// ones go through
// net/http.
package remotetok
