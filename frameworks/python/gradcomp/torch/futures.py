"""Futures whose failure torch's C++ side sees.

``torch.futures.Future.set_exception`` stores the exception as the future's *value*, with a
Python unwrap function that raises it: Python's ``wait()`` raises, but C++ readers (DDP's
Reducer reading a bucket's allreduce or a comm hook's result) get the exception object as a
result. The Reducer then takes a tensor out of it and crashes the process (torch 1.13:
a segmentation fault in ``Reducer::finalize_backward``). A future chained with ``then()``
whose callback raises is failed in C++ as well, so ``loss.backward()`` raises the message.
"""


def _value(fut):
    return fut.value()  # raises the parent's exception inside then(): the child fails in C++


def failing_in_cpp(future):
    """A future completed with `future`'s result, or failed (for C++ too) with its exception."""
    return future.then(_value)
