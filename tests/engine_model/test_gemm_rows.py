"""The deterministic mode's room for whole GEMM chunks (kernels/gemm_rows.py): a linear's input is read in place
when its buffer reaches the last chunk's end, copied otherwise, and the spare rows never reach a real row."""
import torch

from verifier_service.kernels.gemm_rows import GEMM_ROWS, empty_rows, padded, whole_chunks


def test_rows_round_up_to_whole_gemms():
    assert [padded(rows) for rows in (1, 63, 64, 65, 130)] == [64, 64, 64, 128, 192]


def test_an_empty_rows_buffer_is_read_in_place_and_a_tight_one_is_copied():
    roomy = empty_rows((5, 8), torch.empty(0, dtype=torch.bfloat16))
    assert roomy.shape == (5, 8) and roomy.dtype == torch.bfloat16
    roomy.copy_(torch.arange(40.0).reshape(5, 8))
    chunks = whole_chunks(roomy)
    assert chunks.shape == (GEMM_ROWS, 8) and chunks.data_ptr() == roomy.data_ptr()
    tight = torch.arange(40.0).reshape(5, 8)
    copied = whole_chunks(tight)
    assert copied.shape == (GEMM_ROWS, 8) and copied.data_ptr() != tight.data_ptr()
    assert torch.equal(copied[:5], tight)
    whole = torch.arange(64.0 * 8).reshape(64, 8)
    assert whole_chunks(whole) is whole  # already whole GEMMs


def test_rows_of_a_larger_buffer_read_its_next_rows_in_place_and_strided_rows_are_copied():
    buffer = torch.arange(100.0 * 8).reshape(100, 8)
    inside, near_end, strided = buffer[10:13], buffer[50:53], buffer[:3, :4]
    assert whole_chunks(inside).data_ptr() == inside.data_ptr()
    assert torch.equal(whole_chunks(inside), buffer[10:10 + GEMM_ROWS])
    for view in (near_end, strided):  # past the buffer's end / not rows of their own
        copied = whole_chunks(view)
        assert copied.untyped_storage().data_ptr() != buffer.untyped_storage().data_ptr()
        assert torch.equal(copied[:3], view)


def test_spare_rows_never_reach_a_real_row_of_a_chunked_gemm():
    gen = torch.Generator().manual_seed(0)
    weight, x = torch.randn(16, 8, generator=gen), torch.randn(3, 8, generator=gen)
    reference = whole_chunks(x.clone()) @ weight.t()
    room = torch.full((GEMM_ROWS, 8), float("nan"))
    room[:3] = x
    assert torch.equal((whole_chunks(room[:3]) @ weight.t())[:3], reference[:3])
