package holders

import "strata/internal/fault"

// CodeDirectoryBusy is the stable code of the error BusyError returns.
const CodeDirectoryBusy = "directory_busy"

// BusyError returns the directory_busy error (409, fault.Conflict) for path
// and the holders found by Scanner.Holders. holders is never nil in the
// error, so it marshals as [] rather than null.
func BusyError(path string, holders []Holder) error {
	return BusyErrorWith(path, holders, "Processes are using the directory; stop them and retry.")
}

// BusyErrorWith is BusyError with its own message, for a refusal whose
// holders need explaining (unseen or uninspectable ones).
func BusyErrorWith(path string, holders []Holder, message string) error {
	if holders == nil {
		holders = []Holder{}
	}
	return &fault.Error{
		Kind:    fault.Conflict,
		Code:    CodeDirectoryBusy,
		Message: message,
		Fields:  map[string]any{"path": path, "holders": holders},
	}
}
