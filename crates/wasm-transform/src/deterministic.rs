//! Takes the real clock, randomness and sleep away from a module before it is compiled, so a
//! replay computes what the first run computed (docs/TRANSFORMS.md "Determinism and limits"),
//! and hands what it writes to stdout and stderr to the host, so a trap's dead letter says what
//! the module said before it trapped (a Go panic's message).
//!
//! Standard Go's `wasip1` runtime imports WASI's `clock_time_get`, `random_get`,
//! `poll_oneoff` and `fd_write` and does not link without them, so a module cannot be refused
//! for importing them, and Extism offers no hook to replace them in its WASI context. Instead
//! every call the module makes to one of them is pointed at a function added to the module
//! itself:
//!
//! - `clock_time_get` answers [`FIXED_CLOCK_NANOS`] (2000-01-01T00:00:00Z) for every clock;
//!   `clock_res_get` answers 1 ns;
//! - `random_get` fills the buffer with zero bytes;
//! - `poll_oneoff` returns at once, as if the time had passed, for one relative clock
//!   subscription of at most [`PAUSE_NANOS`] (a runtime's own pause: Go's panic waits 1 ms
//!   several times before it prints the panic), and traps for anything else (a sleep, or
//!   waiting for input), so a sleep is a trap at once, never a stall;
//! - `fd_write` to fd 1 or 2 passes each byte to the host function [`STDIO_BYTE`] (imported
//!   from [`STDIO_MODULE`], an import this rewrite adds), which keeps the first of them for the
//!   call's error, and reports everything written; to any other fd it is WASI's own.
//!
//! The replaced imports stay, linked; only the references to them change. Adding the host
//! import moves every defined function's index up by one, and every reference with it.

use std::collections::BTreeMap;

use wasm_encoder::reencode::{Reencode, utils};
use wasm_encoder::{
    BlockType, CodeSection, EntityType, FunctionSection, ImportSection, Instruction, MemArg,
    NameMap, NameSection, TypeSection,
};
use wasmparser::{CompositeInnerType, Parser, Payload, TypeRef, ValType};

/// What the module's clocks read, whatever the time: 2000-01-01T00:00:00Z. Not zero, because
/// Go's runtime refuses to start on a monotonic clock that reads zero.
pub const FIXED_CLOCK_NANOS: i64 = 946_684_800_000_000_000;

/// The longest pause `poll_oneoff` lets pass at once: 1 ms, Go's runtime's `usleep(1000)` on
/// its panic path. A pause is no sleep a transform asks for; the clock does not move either way.
pub const PAUSE_NANOS: i64 = 1_000_000;

/// The module of the host function the module's stdout and stderr bytes go to.
pub const STDIO_MODULE: &str = "extism:host/user";
/// The host function: `(byte: i32) -> i32`, one byte the module wrote to fd 1 or 2; it answers
/// 0 once it wants no more in this call.
pub const STDIO_BYTE: &str = "eos_stdio_byte";

const WASI: &str = "wasi_snapshot_preview1";

/// A WASI function the module may import and what its calls become.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Replacement {
    ClockTimeGet,
    ClockResGet,
    RandomGet,
    PollOneoff,
    FdWrite,
}

/// What an added function's body refers to.
#[derive(Debug, Clone, Copy)]
struct Context {
    /// The import it replaces (still linked: `fd_write` calls it for other fds).
    original: u32,
    /// The host import [`STDIO_BYTE`].
    stdio_byte: u32,
}

impl Replacement {
    const ALL: [Self; 5] = [
        Self::ClockTimeGet,
        Self::ClockResGet,
        Self::RandomGet,
        Self::PollOneoff,
        Self::FdWrite,
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
            Self::FdWrite => "fd_write",
        }
    }

    /// WASI preview 1's signature, which the import must have.
    fn signature(self) -> (&'static [ValType], &'static [ValType]) {
        use ValType::{I32, I64};
        match self {
            Self::ClockTimeGet => (&[I32, I64, I32], &[I32]),
            Self::ClockResGet | Self::RandomGet => (&[I32, I32], &[I32]),
            Self::PollOneoff | Self::FdWrite => (&[I32, I32, I32, I32], &[I32]),
        }
    }

    /// The locals of the added function, after its parameters.
    fn locals(self) -> Vec<(u32, wasm_encoder::ValType)> {
        match self {
            // i, ptr, len, j, total, more
            Self::FdWrite => vec![(6, wasm_encoder::ValType::I32)],
            _ => Vec::new(),
        }
    }

    fn body(self, context: Context) -> Vec<Instruction<'static>> {
        use Instruction as I;
        let ok = I::I32Const(0);
        match self {
            // (id, precision, *time) -> errno
            Self::ClockTimeGet => vec![
                I::LocalGet(2),
                I::I64Const(FIXED_CLOCK_NANOS),
                I::I64Store(at(0, 3)),
                ok,
            ],
            // (id, *resolution) -> errno
            Self::ClockResGet => vec![I::LocalGet(1), I::I64Const(1), I::I64Store(at(0, 3)), ok],
            // (*buf, len) -> errno
            Self::RandomGet => vec![
                I::LocalGet(0),
                I::I32Const(0),
                I::LocalGet(1),
                I::MemoryFill(0),
                ok,
            ],
            // (*subscriptions, *events, nsubscriptions, *nevents) -> errno. A subscription is
            // 48 bytes: userdata u64 @0, tag u8 @8 (0: clock), clock id u32 @16, timeout u64
            // @24, precision u64 @32, flags u16 @40 (1: absolute time); an event 32 bytes:
            // userdata u64 @0, error u16 @8, type u8 @10, fd_readwrite @16..32.
            Self::PollOneoff => poll_oneoff_body(),
            // (fd, *iovs, iovs_len, *nwritten) -> errno; locals 4 i, 5 ptr, 6 len, 7 j,
            // 8 total, 9 more. An iovec is 8 bytes: buf u32 @0, buf_len u32 @4.
            Self::FdWrite => fd_write_body(context),
        }
    }
}

/// `poll_oneoff`'s body: only the one clock subscription a pause makes, answered at once.
fn poll_oneoff_body() -> Vec<Instruction<'static>> {
    use Instruction as I;
    let ok = I::I32Const(0);
    let mut body = Vec::new();
    body.extend(trap_if(vec![I::LocalGet(2), I::I32Const(1), I::I32Ne]));
    body.extend(trap_if(vec![I::LocalGet(0), I::I32Load8U(at(8, 0))]));
    body.extend(trap_if(vec![
        I::LocalGet(0),
        I::I32Load16U(at(40, 1)),
        I::I32Const(1),
        I::I32And,
    ]));
    body.extend(trap_if(vec![
        I::LocalGet(0),
        I::I64Load(at(24, 3)),
        I::I64Const(PAUSE_NANOS),
        I::I64GtU,
    ]));
    // The pause is over: one clock event, no error.
    body.extend([
        I::LocalGet(1),
        I::LocalGet(0),
        I::I64Load(at(0, 3)),
        I::I64Store(at(0, 3)),
    ]);
    for offset in [8, 16, 24] {
        body.extend([I::LocalGet(1), I::I64Const(0), I::I64Store(at(offset, 3))]);
    }
    body.extend([I::LocalGet(3), I::I32Const(1), I::I32Store(at(0, 2)), ok]);
    body
}

/// `fd_write`'s body: stdout and stderr byte by byte to the host's `stdio_byte` (which counts
/// them against the limit), any other fd to WASI's own.
fn fd_write_body(context: Context) -> Vec<Instruction<'static>> {
    use Instruction as I;
    let ok = I::I32Const(0);
    let (fd, iovs, iovs_len, nwritten) = (0, 1, 2, 3);
    let (i, ptr, len, j, total, more) = (4, 5, 6, 7, 8, 9);
    vec![
        // Any fd but stdout and stderr: WASI's own answer (EBADF: no files).
        I::LocalGet(fd),
        I::I32Const(1),
        I::I32Ne,
        I::LocalGet(fd),
        I::I32Const(2),
        I::I32Ne,
        I::I32And,
        I::If(BlockType::Empty),
        I::LocalGet(fd),
        I::LocalGet(iovs),
        I::LocalGet(iovs_len),
        I::LocalGet(nwritten),
        I::Call(context.original),
        I::Return,
        I::End,
        I::I32Const(1),
        I::LocalSet(more),
        I::Block(BlockType::Empty),
        I::Loop(BlockType::Empty),
        I::LocalGet(i),
        I::LocalGet(iovs_len),
        I::I32GeU,
        I::BrIf(1),
        I::LocalGet(iovs),
        I::LocalGet(i),
        I::I32Const(8),
        I::I32Mul,
        I::I32Add,
        I::LocalTee(ptr),
        I::I32Load(at(4, 2)),
        I::LocalSet(len),
        I::LocalGet(ptr),
        I::I32Load(at(0, 2)),
        I::LocalSet(ptr),
        I::LocalGet(total),
        I::LocalGet(len),
        I::I32Add,
        I::LocalSet(total),
        I::I32Const(0),
        I::LocalSet(j),
        I::Block(BlockType::Empty),
        I::Loop(BlockType::Empty),
        I::LocalGet(more),
        I::I32Eqz,
        I::BrIf(1),
        I::LocalGet(j),
        I::LocalGet(len),
        I::I32GeU,
        I::BrIf(1),
        I::LocalGet(ptr),
        I::LocalGet(j),
        I::I32Add,
        I::I32Load8U(at(0, 0)),
        I::Call(context.stdio_byte),
        I::LocalSet(more),
        I::LocalGet(j),
        I::I32Const(1),
        I::I32Add,
        I::LocalSet(j),
        I::Br(0),
        I::End,
        I::End,
        I::LocalGet(i),
        I::I32Const(1),
        I::I32Add,
        I::LocalSet(i),
        I::Br(0),
        I::End,
        I::End,
        // Everything was written, as far as the module can tell.
        I::LocalGet(nwritten),
        I::LocalGet(total),
        I::I32Store(at(0, 2)),
        ok,
    ]
}

/// A memory access at `offset`, aligned to 2^`align` bytes, in memory 0.
fn at(offset: u64, align: u32) -> MemArg {
    MemArg {
        offset,
        align,
        memory_index: 0,
    }
}

/// `condition` followed by a trap when it holds.
fn trap_if(mut condition: Vec<Instruction<'static>>) -> Vec<Instruction<'static>> {
    use Instruction as I;
    condition.extend([I::If(BlockType::Empty), I::Unreachable, I::End]);
    condition
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
    /// Function imports of the module as it is.
    imported_functions: u32,
    /// Types of the module as it is (each of a recursion group counted).
    types: u32,
    /// Function index of the first added function: imported (the host import included) plus
    /// defined functions.
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
        let mut plan = Self {
            replaced,
            imported_functions,
            types: u32::try_from(signatures.len()).unwrap_or(u32::MAX),
            first_added: 0,
        };
        plan.first_added = imported_functions + u32::from(plan.adds_stdio()) + defined_functions;
        Ok(plan)
    }

    /// Whether the host import is added: only for a module that writes with `fd_write`.
    fn adds_stdio(&self) -> bool {
        self.replaced
            .values()
            .any(|&(_, replacement)| replacement == Replacement::FdWrite)
    }

    /// A function index of the module as it is, in the rewritten module (before redirects):
    /// the defined functions move up by one when the host import is added after the others.
    fn moved(&self, func: u32) -> u32 {
        if self.adds_stdio() && func >= self.imported_functions {
            func + 1
        } else {
            func
        }
    }

    /// The added functions, in the order they are appended: (type index, replacement, the
    /// import it replaces).
    fn added(&self) -> impl Iterator<Item = (u32, Replacement, u32)> + '_ {
        self.replaced
            .iter()
            .map(|(&import, &(type_index, replacement))| (type_index, replacement, import))
    }
}

/// Re-encodes the module with every reference to a replaced import pointed at its added
/// function, the host import added, and the added functions appended to the function and code
/// sections.
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
        Ok(self
            .redirect
            .get(&func)
            .copied()
            .unwrap_or_else(|| self.plan.moved(func)))
    }

    fn parse_type_section(
        &mut self,
        types: &mut TypeSection,
        section: wasmparser::TypeSectionReader<'_>,
    ) -> Result<(), wasm_encoder::reencode::Error<Self::Error>> {
        utils::parse_type_section(self, types, section)?;
        if self.plan.adds_stdio() {
            // The host import's type, index `plan.types`.
            types
                .ty()
                .function([wasm_encoder::ValType::I32], [wasm_encoder::ValType::I32]);
        }
        Ok(())
    }

    fn parse_import_section(
        &mut self,
        imports: &mut ImportSection,
        section: wasmparser::ImportSectionReader<'_>,
    ) -> Result<(), wasm_encoder::reencode::Error<Self::Error>> {
        utils::parse_import_section(self, imports, section)?;
        if self.plan.adds_stdio() {
            // After every other import: function index `plan.imported_functions`.
            imports.import(
                STDIO_MODULE,
                STDIO_BYTE,
                EntityType::Function(self.plan.types),
            );
        }
        Ok(())
    }

    fn parse_function_section(
        &mut self,
        functions: &mut FunctionSection,
        section: wasmparser::FunctionSectionReader<'_>,
    ) -> Result<(), wasm_encoder::reencode::Error<Self::Error>> {
        utils::parse_function_section(self, functions, section)?;
        for (type_index, _, _) in self.plan.added() {
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
        for (_, replacement, import) in self.plan.added() {
            let context = Context {
                original: import,
                stdio_byte: self.plan.imported_functions,
            };
            let mut function = wasm_encoder::Function::new(replacement.locals());
            for instruction in replacement.body(context) {
                function.instruction(&instruction);
            }
            function.instruction(&Instruction::End);
            code.function(&function);
        }
        Ok(())
    }

    /// Function names keep their functions (the imports keep their indices, the defined
    /// functions move with the added import), and the added functions get none: a name map
    /// must stay in index order, which redirecting an import's name would break. Local and
    /// label names are of defined functions, which `function_index` moves.
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
                    functions.append(self.plan.moved(naming.index), naming.name);
                }
                names.functions(&functions);
                Ok(())
            }
            other => utils::parse_custom_name_subsection(self, names, other),
        }
    }
}

/// The module with its clock, randomness, sleep and stdio replaced; the bytes as they are when
/// it imports none of them.
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
