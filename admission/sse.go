package admission

// KeepAlive is an SSE comment line that keeps a parked streaming client's
// connection and intermediaries from timing out. Clients ignore it.
var KeepAlive = []byte(": keep-alive\n\n")

// ErrorEvent renders an SSE error event carrying an OpenAI-style error
// body, for errors that happen after a stream's 200 has been sent:
//
//	event: error
//	data: {"error":{"message":"...","type":"...","param":null,"code":503}}
//
// The JSON is on one line (newlines in message are escaped), so the event
// cannot be split or end early.
func ErrorEvent(message string, status int) []byte {
	body := ErrorJSON(message, "", status)
	out := make([]byte, 0, len(body)+len("event: error\ndata: \n\n"))
	out = append(out, "event: error\ndata: "...)
	out = append(out, body...)
	return append(out, "\n\n"...)
}
