"""Pinpoint's own training loop: what a run trains (`engine`: the model of `models`, the data,
the optimizer), the `trainer` that only takes steps, the `controller` that runs it with its
`actions` and decides which calls are captured (`capture`)."""
