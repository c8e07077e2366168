package jsend

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"

	"strata/internal/fault"
)

// HeaderRequestID names the response header that carries the request id.
const HeaderRequestID = "X-Request-Id"

// Status maps an error kind to its HTTP status.
func Status(k fault.Kind) int {
	switch k {
	case fault.Invalid:
		return http.StatusBadRequest
	case fault.Unauthorized:
		return http.StatusUnauthorized
	case fault.Forbidden:
		return http.StatusForbidden
	case fault.NotFound:
		return http.StatusNotFound
	case fault.MethodNotAllowed:
		return http.StatusMethodNotAllowed
	case fault.Conflict:
		return http.StatusConflict
	case fault.TooLarge:
		return http.StatusRequestEntityTooLarge
	case fault.UnsupportedMedia:
		return http.StatusUnsupportedMediaType
	case fault.Unprocessable:
		return http.StatusUnprocessableEntity
	case fault.TooManyRequests:
		return http.StatusTooManyRequests
	case fault.Unavailable:
		return http.StatusServiceUnavailable
	case fault.InsufficientStorage:
		return http.StatusInsufficientStorage
	case fault.BadGateway:
		return http.StatusBadGateway
	default:
		return http.StatusInternalServerError
	}
}

// Envelope is the JSend body of every response. Exactly one of its shapes
// is used per status: Data for success and fail, Message and Code for error.
type Envelope struct {
	Status  string          `json:"status"`
	Data    json.RawMessage `json:"data,omitempty"`
	Message string          `json:"message,omitempty"`
	Code    int             `json:"code,omitempty"`
}

// Success writes 200 with data.
func Success(w http.ResponseWriter, data any) {
	write(w, http.StatusOK, map[string]any{"status": "success", "data": data})
}

// SuccessStream writes status with the data that write writes, valid
// JSON, as the data of a JSend success envelope: for data made as it is
// written, which nothing holds whole. An error of write's own (not one
// of w's: a client gone is not told) breaks the answer off
// (http.ErrAbortHandler): its envelope has begun, and the client must
// not take a short answer for a whole one.
func SuccessStream(w http.ResponseWriter, status int, write func(w io.Writer) error) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, `{"status":"success","data":`)
	if err := write(w); err != nil {
		panic(http.ErrAbortHandler)
	}
	_, _ = io.WriteString(w, "}\n")
}

// Error writes err as a JSend fail (4xx) or error (5xx) envelope. Causes
// are logged on log with the request id; a 5xx never shows them.
func Error(w http.ResponseWriter, log *slog.Logger, requestID string, err error) {
	fe := fault.As(err)
	if fe == nil {
		fe = &fault.Error{Kind: fault.Internal, Code: "internal", Message: "internal error", Err: err}
	}
	status := Status(fe.Kind)
	if status >= 500 {
		if log != nil {
			log.Error("request failed", "request_id", requestID, "code", fe.Code, "status", status, "err", err)
		}
		if fe.Kind == fault.Internal {
			write(w, status, map[string]any{"status": "error", "message": "internal error", "code": status})
			return
		}
		// A classified server error also names its stable code, in data
		// (which JSend allows on errors): additive to the contract's shape.
		write(w, status, map[string]any{"status": "error", "message": fe.Message, "code": status,
			"data": map[string]any{"code": fe.Code}})
		return
	}
	data := make(map[string]any, len(fe.Fields)+2)
	for k, v := range fe.Fields {
		data[k] = v
	}
	data["code"] = fe.Code
	data["message"] = fe.Message
	write(w, status, map[string]any{"status": "fail", "data": data})
}

func write(w http.ResponseWriter, status int, body any) {
	b, err := json.Marshal(body)
	if err != nil {
		status = http.StatusInternalServerError
		b = []byte(`{"status":"error","message":"internal error","code":500}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}
