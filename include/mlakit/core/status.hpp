#pragma once
#include <string>
#include <utility>

namespace mlakit {

enum class StatusCode {
  ok = 0,
  invalid_argument,     // an argument is outside the supported domain; the message says which
  not_supported,        // a valid request this build cannot serve (e.g. no GPU backend compiled)
  workspace_too_small,  // the caller's workspace is smaller than workspace_bytes()
  runtime_error,        // the GPU runtime reported an error (launch, attribute, device query)
};

constexpr const char* status_code_name(StatusCode c) {
  switch (c) {
    case StatusCode::ok:
      return "ok";
    case StatusCode::invalid_argument:
      return "invalid_argument";
    case StatusCode::not_supported:
      return "not_supported";
    case StatusCode::workspace_too_small:
      return "workspace_too_small";
    case StatusCode::runtime_error:
      return "runtime_error";
  }
  return "unknown";
}

// Result of every host API call. Library code never aborts: every failure is a Status whose
// message names the argument, its value and the allowed range.
class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }

  explicit operator bool() const { return code_ == StatusCode::ok; }
  bool is_ok() const { return code_ == StatusCode::ok; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::ok;
  std::string message_;
};

}  // namespace mlakit
