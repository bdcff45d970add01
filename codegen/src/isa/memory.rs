//! Memory: addresses, loads and stores, shared-memory arrays (static and dynamic), constant
//! tables in global memory, and the asynchronous global → shared copies of sm_80 (`cp.async`).
//!
//! Design notes: book/src/design/isa.md

use inkwell::module::Linkage;
use inkwell::types::{BasicType, BasicTypeEnum};
use inkwell::values::{BasicValue, BasicValueEnum, FloatValue, IntValue, PointerValue};
use inkwell::AddressSpace;

use super::builder::basic;
use super::KernelBuilder;
use crate::math::R;
use crate::error::CodegenError;
use crate::llvm::{ADDRESS_SPACE_GLOBAL, ADDRESS_SPACE_SHARED};

impl<'ctx> KernelBuilder<'ctx> {
    /// `&ptr[idx]` for elements of type `elem` (an in-bounds GEP).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn gep(&self, elem: BasicTypeEnum<'ctx>, ptr: PointerValue<'ctx>, idx: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
        // SAFETY (of the IR, not of Rust): every generator computes in-range indices.
        Ok(unsafe { self.b.build_in_bounds_gep(elem, ptr, &[idx], "p") }?)
    }

    /// Loads a `ty` from `ptr` with alignment `align` bytes.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn load(&self, ty: BasicTypeEnum<'ctx>, ptr: PointerValue<'ctx>, align: u32) -> R<BasicValueEnum<'ctx>> {
        let v = self.b.build_load(ty, ptr, "v")?;
        if let Some(i) = v.as_instruction_value() {
            i.set_alignment(align).map_err(|e| CodegenError::Builder(e.to_string()))?;
        }
        Ok(v)
    }

    /// Stores `v` to `ptr` with alignment `align` bytes.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn store(&self, ptr: PointerValue<'ctx>, v: BasicValueEnum<'ctx>, align: u32) -> R<()> {
        let st = self.b.build_store(ptr, v)?;
        st.set_alignment(align).map_err(|e| CodegenError::Builder(e.to_string()))?;
        Ok(())
    }

    /// A shared-memory array of `len` elements of `elem`, aligned to `align` bytes: a module
    /// global in `addrspace(3)` (PTX `.shared`), statically sized (≤ 48 KiB per kernel
    /// without opt-in). Returns its address.
    pub fn shared_array(&mut self, elem: BasicTypeEnum<'ctx>, len: u32, align: u32, name: &str) -> PointerValue<'ctx> {
        let ty = elem.array_type(len);
        self.globals += 1;
        let g = self.module.add_global(ty, Some(AddressSpace::from(ADDRESS_SPACE_SHARED)), &format!("{name}_{}", self.globals));
        g.set_linkage(Linkage::Internal);
        g.set_initializer(&ty.get_undef());
        g.set_alignment(align);
        g.as_pointer_value()
    }

    /// A constant table of `f64` in global memory (`.global`, read through `ld.global.nc`),
    /// for per-lane lookups (RoPE's inverse frequencies): constant memory would serialise a
    /// warp whose lanes read different entries.
    pub fn global_f64_table(&mut self, values: &[f64], name: &str) -> PointerValue<'ctx> {
        let f64t = self.cx.f64_type();
        let elems: Vec<FloatValue<'ctx>> = values.iter().map(|&v| f64t.const_float(v)).collect();
        let init = f64t.const_array(&elems);
        self.globals += 1;
        let g = self.module.add_global(init.get_type(), Some(AddressSpace::from(ADDRESS_SPACE_GLOBAL)), &format!("{name}_{}", self.globals));
        g.set_linkage(Linkage::Internal);
        g.set_constant(true);
        g.set_initializer(&init);
        g.set_alignment(16);
        g.as_pointer_value()
    }

    /// The base of the kernel's dynamic shared memory (`extern .shared .align 16 .b8
    /// dsmem[]`, sized by the launch), offset by an opaque zero (`mov.u32 $0, 0;` as inline
    /// asm) computed in the prologue: every access is then an instruction off this base, never
    /// a constant expression over the global, which lets the CPU simulation of the tests give
    /// each CTA of a cluster its own copy (ptxas folds the zero).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn dynamic_shared_base(&mut self) -> R<PointerValue<'ctx>> {
        let i8t = self.cx.i8_type();
        let g = match self.module.get_global("dsmem") {
            Some(g) => g,
            None => {
                let g = self.module.add_global(i8t.array_type(0), Some(AddressSpace::from(ADDRESS_SPACE_SHARED)), "dsmem");
                g.set_linkage(Linkage::External);
                g.set_alignment(16);
                g
            }
        };
        self.in_prologue(|kb| {
            let i32t = kb.cx.i32_type();
            let f = kb.cx.create_inline_asm(i32t.fn_type(&[], false), "mov.u32 $0, 0;".to_owned(), "=r".to_owned(), false, false, None, false);
            let z = kb.b.build_indirect_call(i32t.fn_type(&[], false), f, &[], "smem_off")?;
            let z = basic(z.try_as_basic_value().basic(), "inline asm")?.into_int_value();
            // SAFETY (of the IR, not of Rust): an in-bounds offset of the dynamic area.
            Ok(unsafe { kb.b.build_gep(i8t, g.as_pointer_value(), &[z], "dsmem") }?)
        })
    }

    /// `cp.async.cg.shared.global [dst], [src], 16, src_bytes` (PTX ISA §9.7.9.3, "cp.async";
    /// `llvm.nvvm.cp.async.cg.shared.global.16.s`): starts an asynchronous copy of 16 bytes
    /// from global memory `src` (`ptr addrspace(1)`) to shared memory `dst`
    /// (`ptr addrspace(3)`), cached in L2 only (`.cg`). Only the first `src_bytes` (an `i32`,
    /// 0 ..= 16) are read, the rest of the 16 destination bytes are zero-filled: 0 reads
    /// nothing (the source address is not accessed), which predicates a copy off where its
    /// source lies outside a tensor, and 2·(elements left) zero-fills a tail. Both addresses
    /// must be 16-byte aligned.
    ///
    /// The copy is asynchronous: group the copies issued so far with
    /// [`KernelBuilder::cp_async_commit`], wait for groups with [`KernelBuilder::cp_async_wait`]
    /// (which covers only the calling thread's copies), then [`KernelBuilder::barrier`] before
    /// other threads read the data.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cp_async_16(&self, dst: PointerValue<'ctx>, src: PointerValue<'ctx>, src_bytes: IntValue<'ctx>) -> R<()> {
        self.intrinsic("llvm.nvvm.cp.async.cg.shared.global.16.s", &[], &[dst.into(), src.into(), src_bytes.into()])?;
        Ok(())
    }

    /// `cp.async.commit_group` (PTX ISA §9.7.9.3.2; `llvm.nvvm.cp.async.commit.group`): closes
    /// the calling thread's group of [`KernelBuilder::cp_async_16`] copies issued since the
    /// last commit (an empty group is fine and completes at once).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cp_async_commit(&self) -> R<()> {
        self.intrinsic("llvm.nvvm.cp.async.commit.group", &[], &[])?;
        Ok(())
    }

    /// `cp.async.wait_group n` (PTX ISA §9.7.9.3.3; `llvm.nvvm.cp.async.wait.group`): waits
    /// until at most `n` of the calling thread's committed groups are still pending (the
    /// older ones have landed in shared memory). With a pipeline of `s` stages that commits
    /// one group per stage, `n = s − 2` makes the oldest stage ready.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn cp_async_wait(&self, n: u32) -> R<()> {
        self.intrinsic("llvm.nvvm.cp.async.wait.group", &[], &[self.i32c(i64::from(n)).into()])?;
        Ok(())
    }
}
