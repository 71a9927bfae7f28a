//! How much code a component asks the host to compile, counted before
//! anything is compiled (ARCHITECTURE.md, "Compile limits"): compiling
//! takes memory and time in proportion to the functions and code bytes of
//! every core module in the component, so a component over
//! [`CompileLimits`] is refused without compiling it.

/// The most code one component may bring: `[runtime]
/// max_component_functions` and `max_component_code_mib`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompileLimits {
    /// Functions with a body, all core modules of the component together.
    /// Default [`CompileLimits::DEFAULT_FUNCTIONS`].
    pub max_functions: u64,
    /// Bytes of code sections, all core modules together. Default
    /// [`CompileLimits::DEFAULT_CODE_BYTES`].
    pub max_code_bytes: u64,
}

impl CompileLimits {
    /// 50,000 functions: about 4 times the Python (13,484) or
    /// StarlingMonkey (12,673) credit component's.
    pub const DEFAULT_FUNCTIONS: u64 = 50_000;
    /// 32 MiB of code: about 3.5 times StarlingMonkey's (8.8 MiB) and 5
    /// times Python's (6.3 MiB).
    pub const DEFAULT_CODE_BYTES: u64 = 32 << 20;
}

impl Default for CompileLimits {
    fn default() -> Self {
        Self {
            max_functions: Self::DEFAULT_FUNCTIONS,
            max_code_bytes: Self::DEFAULT_CODE_BYTES,
        }
    }
}

/// What a component brings to compile, all core modules (nested ones
/// included) together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CodeSize {
    /// Core modules.
    pub modules: u64,
    /// Functions with a body (imported ones are not compiled).
    pub functions: u64,
    /// Bytes of the code sections.
    pub code_bytes: u64,
}

/// Which limit a component is over, with what it has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverLimit {
    /// More functions than `max_functions`.
    Functions {
        /// The functions it has.
        has: u64,
        /// `max_functions`.
        limit: u64,
    },
    /// More code bytes than `max_code_bytes`.
    CodeBytes {
        /// The code bytes it has.
        has: u64,
        /// `max_code_bytes`.
        limit: u64,
    },
}

/// Counts the core modules, functions and code bytes of `bytes` (a
/// component or a core module) with wasmparser, reading section headers
/// only: no function body is parsed.
///
/// # Errors
/// wasmparser's one line when the bytes are not well-formed enough to
/// count (the compile that would follow fails the same way).
pub fn measure(bytes: &[u8]) -> Result<CodeSize, String> {
    use wasmparser::{Chunk, Encoding, Parser, Payload};
    let mut size = CodeSize::default();
    let mut parser = Parser::new(0);
    // The parsers of the enclosing components while a nested one is read.
    let mut outer: Vec<Parser> = Vec::new();
    let mut offset = 0usize;
    loop {
        let rest = bytes.get(offset..).unwrap_or_default();
        let (consumed, payload) = match parser.parse(rest, true).map_err(|e| e.to_string())? {
            Chunk::NeedMoreData(_) => return Err("the file ends too early".into()),
            Chunk::Parsed { consumed, payload } => (consumed, payload),
        };
        offset = offset.saturating_add(consumed);
        match payload {
            Payload::Version {
                encoding: Encoding::Module,
                ..
            } => size.modules += 1,
            // The bodies are skipped, never visited: counting costs one
            // step per section, not per function.
            Payload::CodeSectionStart {
                count,
                range,
                size: rest_of_section,
            } => {
                size.functions += u64::from(count);
                size.code_bytes += range.len() as u64;
                parser.skip_section();
                offset = offset.saturating_add(rest_of_section as usize);
                if offset > bytes.len() {
                    return Err("the file ends inside a code section".into());
                }
            }
            Payload::ModuleSection { parser: nested, .. }
            | Payload::ComponentSection { parser: nested, .. } => {
                outer.push(std::mem::replace(&mut parser, nested));
            }
            Payload::End(_) => match outer.pop() {
                Some(up) => parser = up,
                None => return Ok(size),
            },
            _ => {}
        }
    }
}

impl CompileLimits {
    /// Which limit `size` is over, the functions first; `None` when within.
    pub fn check(&self, size: &CodeSize) -> Option<OverLimit> {
        if size.functions > self.max_functions {
            return Some(OverLimit::Functions {
                has: size.functions,
                limit: self.max_functions,
            });
        }
        if size.code_bytes > self.max_code_bytes {
            return Some(OverLimit::CodeBytes {
                has: size.code_bytes,
                limit: self.max_code_bytes,
            });
        }
        None
    }
}

impl std::fmt::Display for OverLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OverLimit::Functions { has, limit } => write!(
                f,
                "has {has} functions, more than the {limit} a component may have ([runtime] max_component_functions)"
            ),
            OverLimit::CodeBytes { has, limit } => write!(
                f,
                "has {:.1} MiB of code, more than the {} MiB a component may have ([runtime] max_component_code_mib)",
                *has as f64 / f64::from(1 << 20),
                limit >> 20
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
    use super::*;

    fn funcs(n: usize) -> String {
        "(func (result i32) i32.const 7)".repeat(n)
    }

    fn module(n: usize) -> String {
        format!("(module {})", funcs(n))
    }

    #[test]
    fn functions_and_code_of_every_core_module_count_nested_ones_too() {
        let core = wat::parse_str(module(3)).unwrap();
        let m = measure(&core).unwrap();
        assert_eq!((m.modules, m.functions), (1, 3));
        // Each body: its size, no locals, i32.const 7, end (5 bytes); the
        // section's contents start with the count (1 byte).
        assert_eq!(m.code_bytes, 3 * 5 + 1);

        let component = wat::parse_str(format!(
            "(component (core module {}) (component (core module {})) (core module {}))",
            funcs(2),
            funcs(5),
            r#"(import "a" "f" (func))"#,
        ))
        .unwrap();
        let m = measure(&component).unwrap();
        assert_eq!((m.modules, m.functions), (3, 7));
        assert_eq!(m.code_bytes, (2 * 5 + 1) + (5 * 5 + 1));
    }

    #[test]
    fn limits_name_the_setting_over() {
        let limits = CompileLimits {
            max_functions: 10,
            max_code_bytes: 2 << 20,
        };
        let within = CodeSize {
            modules: 1,
            functions: 10,
            code_bytes: 2 << 20,
        };
        assert_eq!(limits.check(&within), None);
        let many = CodeSize {
            functions: 11,
            ..within
        };
        assert_eq!(
            limits.check(&many).map(|o| o.to_string()).as_deref(),
            Some(
                "has 11 functions, more than the 10 a component may have ([runtime] max_component_functions)"
            )
        );
        let big = CodeSize {
            code_bytes: 3 << 20,
            ..within
        };
        assert_eq!(
            limits.check(&big).map(|o| o.to_string()).as_deref(),
            Some(
                "has 3.0 MiB of code, more than the 2 MiB a component may have ([runtime] max_component_code_mib)"
            )
        );
    }

    #[test]
    fn damaged_bytes_are_an_error_not_a_panic() {
        let core = wat::parse_str(module(3)).unwrap();
        for cut in [9, core.len() / 2, core.len() - 1] {
            assert!(measure(&core[..cut]).is_err(), "cut at {cut}");
        }
        assert!(measure(b"\0asm\x0d\0\x01\0\xff\xff").is_err());
    }
}
