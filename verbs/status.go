package verbs

import "fmt"

// Status is a completion status. The values are those of ibv_wc_status,
// so a provider over libibverbs passes them through unchanged.
type Status uint32

const (
	StatusSuccess       Status = 0
	StatusLocalLength   Status = 1  // IBV_WC_LOC_LEN_ERR
	StatusLocalQPOp     Status = 2  // IBV_WC_LOC_QP_OP_ERR
	StatusLocalProtect  Status = 4  // IBV_WC_LOC_PROT_ERR
	StatusWRFlush       Status = 5  // IBV_WC_WR_FLUSH_ERR
	StatusMWBind        Status = 6  // IBV_WC_MW_BIND_ERR
	StatusBadResponse   Status = 7  // IBV_WC_BAD_RESP_ERR
	StatusLocalAccess   Status = 8  // IBV_WC_LOC_ACCESS_ERR
	StatusRemoteInvalid Status = 9  // IBV_WC_REM_INV_REQ_ERR
	StatusRemoteAccess  Status = 10 // IBV_WC_REM_ACCESS_ERR
	StatusRemoteOp      Status = 11 // IBV_WC_REM_OP_ERR
	StatusRetryExceeded Status = 12 // IBV_WC_RETRY_EXC_ERR
	StatusRNRRetry      Status = 13 // IBV_WC_RNR_RETRY_EXC_ERR
	StatusRemoteAborted Status = 16 // IBV_WC_REM_ABORT_ERR
	StatusFatal         Status = 20 // IBV_WC_FATAL_ERR
	StatusGeneral       Status = 21 // IBV_WC_GENERAL_ERR
)

var statusNames = map[Status]string{
	StatusSuccess:       "success",
	StatusLocalLength:   "local length error",
	StatusLocalQPOp:     "local QP operation error",
	StatusLocalProtect:  "local protection error",
	StatusWRFlush:       "work request flushed",
	StatusMWBind:        "memory window bind error",
	StatusBadResponse:   "bad response",
	StatusLocalAccess:   "local access error",
	StatusRemoteInvalid: "remote invalid request",
	StatusRemoteAccess:  "remote access error",
	StatusRemoteOp:      "remote operation error",
	StatusRetryExceeded: "transport retry counter exceeded",
	StatusRNRRetry:      "RNR retry counter exceeded",
	StatusRemoteAborted: "remote aborted",
	StatusFatal:         "fatal error",
	StatusGeneral:       "general error",
}

func (s Status) String() string {
	if n, ok := statusNames[s]; ok {
		return n
	}
	return fmt.Sprintf("status %d", uint32(s))
}

// Error makes a Status usable as an error, so callers can write
// errors.Is(err, verbs.StatusRemoteAccess).
func (s Status) Error() string { return s.String() }
