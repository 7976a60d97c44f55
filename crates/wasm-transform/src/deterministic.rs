//! Takes the real clock, randomness and sleep away from a module before it is compiled, so a
//! replay computes what the first run computed (docs/TRANSFORMS.md "Determinism and limits").
//!
//! Standard Go's `wasip1` runtime imports WASI's `clock_time_get`, `random_get` and
//! `poll_oneoff` and does not link without them, so a module cannot be refused for importing
//! them, and Extism offers no hook to replace them in its WASI context. Instead every call the
//! module makes to one of them is pointed at a function added to the module itself:
//!
//! - `clock_time_get` answers [`FIXED_CLOCK_NANOS`] (2000-01-01T00:00:00Z) for every clock;
//!   `clock_res_get` answers 1 ns;
//! - `random_get` fills the buffer with zero bytes;
//! - `poll_oneoff` (a sleep, or waiting for input) traps.
//!
//! The imports themselves stay, linked and never called, so no other function index moves:
//! only the references to those four change.

use std::collections::BTreeMap;

use wasm_encoder::reencode::{Reencode, utils};
use wasm_encoder::{CodeSection, FunctionSection, Instruction, MemArg, NameMap, NameSection};
use wasmparser::{CompositeInnerType, Parser, Payload, TypeRef, ValType};

/// What the module's clocks read, whatever the time: 2000-01-01T00:00:00Z. Not zero, because
/// Go's runtime refuses to start on a monotonic clock that reads zero.
pub const FIXED_CLOCK_NANOS: i64 = 946_684_800_000_000_000;

const WASI: &str = "wasi_snapshot_preview1";

/// A WASI function the module may import and what its calls become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replacement {
    ClockTimeGet,
    ClockResGet,
    RandomGet,
    PollOneoff,
}

impl Replacement {
    const ALL: [Self; 4] = [
        Self::ClockTimeGet,
        Self::ClockResGet,
        Self::RandomGet,
        Self::PollOneoff,
    ];

    fn of(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.name() == name)
    }

    /// The WASI function's name.
    fn name(self) -> &'static str {
        match self {
            Self::ClockTimeGet => "clock_time_get",
            Self::ClockResGet => "clock_res_get",
            Self::RandomGet => "random_get",
            Self::PollOneoff => "poll_oneoff",
        }
    }

    /// WASI preview 1's signature, which the import must have.
    fn signature(self) -> (&'static [ValType], &'static [ValType]) {
        use ValType::{I32, I64};
        match self {
            Self::ClockTimeGet => (&[I32, I64, I32], &[I32]),
            Self::ClockResGet | Self::RandomGet => (&[I32, I32], &[I32]),
            Self::PollOneoff => (&[I32, I32, I32, I32], &[I32]),
        }
    }

    fn body(self) -> Vec<Instruction<'static>> {
        let store = MemArg {
            offset: 0,
            align: 3,
            memory_index: 0,
        };
        let ok = Instruction::I32Const(0);
        match self {
            // (id, precision, *time) -> errno
            Self::ClockTimeGet => vec![
                Instruction::LocalGet(2),
                Instruction::I64Const(FIXED_CLOCK_NANOS),
                Instruction::I64Store(store),
                ok,
            ],
            // (id, *resolution) -> errno
            Self::ClockResGet => vec![
                Instruction::LocalGet(1),
                Instruction::I64Const(1),
                Instruction::I64Store(store),
                ok,
            ],
            // (*buf, len) -> errno
            Self::RandomGet => vec![
                Instruction::LocalGet(0),
                Instruction::I32Const(0),
                Instruction::LocalGet(1),
                Instruction::MemoryFill(0),
                ok,
            ],
            Self::PollOneoff => vec![Instruction::Unreachable],
        }
    }
}

/// Why a module cannot be made deterministic.
#[derive(Debug, thiserror::Error)]
pub enum RewriteError {
    /// The bytes do not parse as a WebAssembly module.
    #[error("the WebAssembly module does not parse: {0}")]
    Parse(#[from] wasmparser::BinaryReaderError),
    /// Re-encoding failed.
    #[error("the WebAssembly module cannot be re-encoded: {0}")]
    Encode(String),
    /// An import has the name of a WASI function but not its signature.
    #[error("the module imports {WASI}::{0} with a signature WASI preview 1 does not have")]
    Signature(&'static str),
    /// It imports one of the functions but has no memory or no functions of its own.
    #[error("the module imports {WASI}::{0} but has no memory or no functions of its own")]
    Shape(&'static str),
}

/// The module's imports that are replaced, found in a first pass.
struct Plan {
    /// Import function index → (its type index, what replaces it).
    replaced: BTreeMap<u32, (u32, Replacement)>,
    /// Function index of the first added function: imported plus defined functions.
    first_added: u32,
}

impl Plan {
    fn of(bytes: &[u8]) -> Result<Self, RewriteError> {
        let mut signatures: Vec<Option<(Vec<ValType>, Vec<ValType>)>> = Vec::new();
        let mut replaced = BTreeMap::new();
        let mut imported_functions = 0;
        let mut defined_functions = 0;
        let mut memories = 0;
        for payload in Parser::new(0).parse_all(bytes) {
            match payload? {
                Payload::TypeSection(reader) => {
                    for group in reader {
                        for sub_type in group?.into_types() {
                            signatures.push(match &sub_type.composite_type.inner {
                                CompositeInnerType::Func(func) => {
                                    Some((func.params().to_vec(), func.results().to_vec()))
                                }
                                _ => None,
                            });
                        }
                    }
                }
                Payload::ImportSection(reader) => {
                    for import in reader {
                        let import = import?;
                        match import.ty {
                            TypeRef::Func(type_index) => {
                                if import.module == WASI
                                    && let Some(replacement) = Replacement::of(import.name)
                                {
                                    replaced.insert(imported_functions, (type_index, replacement));
                                }
                                imported_functions += 1;
                            }
                            TypeRef::Memory(_) => memories += 1,
                            _ => {}
                        }
                    }
                }
                Payload::FunctionSection(reader) => defined_functions = reader.count(),
                Payload::MemorySection(reader) => memories += reader.count(),
                _ => {}
            }
        }
        for &(type_index, replacement) in replaced.values() {
            let name = replacement.name();
            let (params, results) = replacement.signature();
            match signatures.get(type_index as usize) {
                Some(Some((p, r))) if p == params && r == results => {}
                _ => return Err(RewriteError::Signature(name)),
            }
            if memories == 0 || defined_functions == 0 {
                return Err(RewriteError::Shape(name));
            }
        }
        Ok(Self {
            replaced,
            first_added: imported_functions + defined_functions,
        })
    }

    /// The added functions, in the order they are appended: (type index, replacement).
    fn added(&self) -> impl Iterator<Item = (u32, Replacement)> + '_ {
        self.replaced.values().copied()
    }
}

/// Re-encodes the module with every reference to a replaced import pointed at its added
/// function, and the added functions appended to the function and code sections.
struct Rewriter {
    /// Import function index → the index of the function that replaces it.
    redirect: BTreeMap<u32, u32>,
    plan: Plan,
}

impl Reencode for Rewriter {
    type Error = std::convert::Infallible;

    fn function_index(
        &mut self,
        func: u32,
    ) -> Result<u32, wasm_encoder::reencode::Error<Self::Error>> {
        Ok(self.redirect.get(&func).copied().unwrap_or(func))
    }

    fn parse_function_section(
        &mut self,
        functions: &mut FunctionSection,
        section: wasmparser::FunctionSectionReader<'_>,
    ) -> Result<(), wasm_encoder::reencode::Error<Self::Error>> {
        utils::parse_function_section(self, functions, section)?;
        for (type_index, _) in self.plan.added() {
            functions.function(type_index);
        }
        Ok(())
    }

    fn parse_code_section(
        &mut self,
        code: &mut CodeSection,
        section: wasmparser::CodeSectionReader<'_>,
    ) -> Result<(), wasm_encoder::reencode::Error<Self::Error>> {
        utils::parse_code_section(self, code, section)?;
        for (_, replacement) in self.plan.added() {
            let mut function = wasm_encoder::Function::new([]);
            for instruction in replacement.body() {
                function.instruction(&instruction);
            }
            function.instruction(&Instruction::End);
            code.function(&function);
        }
        Ok(())
    }

    /// Function names keep their indices (the imports keep theirs too), and the added
    /// functions get none: a name map must stay in index order, which redirecting an import's
    /// name would break. Local and label names are of defined functions, which never move.
    fn parse_custom_name_subsection(
        &mut self,
        names: &mut NameSection,
        section: wasmparser::Name<'_>,
    ) -> Result<(), wasm_encoder::reencode::Error<Self::Error>> {
        match section {
            wasmparser::Name::Function(map) => {
                let mut functions = NameMap::new();
                for naming in map {
                    let naming = naming?;
                    functions.append(naming.index, naming.name);
                }
                names.functions(&functions);
                Ok(())
            }
            other => utils::parse_custom_name_subsection(self, names, other),
        }
    }
}

/// The module with its clock, randomness and sleep replaced; the bytes as they are when it
/// imports none of them.
pub fn rewrite(bytes: &[u8]) -> Result<Vec<u8>, RewriteError> {
    let plan = Plan::of(bytes)?;
    if plan.replaced.is_empty() {
        return Ok(bytes.to_vec());
    }
    let redirect = plan
        .replaced
        .keys()
        .zip(plan.first_added..)
        .map(|(&import, added)| (import, added))
        .collect();
    let mut rewriter = Rewriter { redirect, plan };
    let mut module = wasm_encoder::Module::new();
    rewriter
        .parse_core_module(&mut module, Parser::new(0), bytes)
        .map_err(|error| RewriteError::Encode(error.to_string()))?;
    Ok(module.finish())
}
