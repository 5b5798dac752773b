//! hexlora-dsp: the firmware that serves frozen-weight projections.
#![cfg_attr(not(test), no_std)]
