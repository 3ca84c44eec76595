//! Logging through the host. The host attributes each line to the policy and bounds how much a
//! policy may log per call.

use crate::types::LogLevel;

fn emit(level: LogLevel, message: &str) {
    #[cfg(target_arch = "wasm32")]
    crate::bindings::allot::policy::host::log(level, message);
    // Natively (tests, benchmarks) there is no host: keep quiet unless asked.
    #[cfg(not(target_arch = "wasm32"))]
    if std::env::var_os("ALLOT_POLICY_LOG").is_some() {
        eprintln!("{level:?}: {message}");
    }
}

pub fn error(message: &str) {
    emit(LogLevel::Error, message)
}

pub fn warn(message: &str) {
    emit(LogLevel::Warn, message)
}

pub fn info(message: &str) {
    emit(LogLevel::Info, message)
}

pub fn debug(message: &str) {
    emit(LogLevel::Debug, message)
}
