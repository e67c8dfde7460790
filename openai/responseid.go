package openai

import "errors"

// errFound stops a walk once what it looks for is found.
var errFound = errors.New("found")

// ResponseID returns the top-level "id" of a non-streaming /v1/responses
// answer, given its first bytes: vLLM writes the id first, so the prefix
// a gateway holds when the body starts passing is enough. Only the
// members before the id are walked (a truncated body is fine past it);
// ok is false when the prefix ends or is malformed before a top-level
// string id, or the id is not one worth recording (see MaxResponseID).
// It never allocates more than the id.
func ResponseID(prefix []byte) (id string, ok bool) {
	s := &scanner{b: prefix}
	s.ws()
	if s.peek() != '{' {
		return "", false
	}
	var found []byte
	err := s.object(func(ks, ke int, esc bool) error {
		if string(keyBytes(prefix, ks, ke, esc)) != "id" {
			return s.skip()
		}
		if s.peek() != '"' {
			return errNotString
		}
		st, en, esc, err := s.str()
		if err != nil {
			return err
		}
		found = responseID(decodedString(prefix, st, en, esc))
		return errFound
	})
	if err != errFound || found == nil {
		return "", false
	}
	return string(found), true
}

// errNotString stops ResponseID at an id that is not a string.
var errNotString = errors.New("id is not a string")

// ResponseNotFoundJSON is vLLM's 404 body for a previous_response_id it
// does not hold: {"error":{"message":"Response with id '<id>' not
// found.","type":"invalid_request_error","param":"response_id","code":404}}.
func ResponseNotFoundJSON(id string) []byte {
	return errorJSON("Response with id '"+id+"' not found.", "invalid_request_error", "response_id", 404)
}
