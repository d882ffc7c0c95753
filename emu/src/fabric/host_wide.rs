//! Device operations every process on the host fabric sees: a cable pulled or an event raised
//! host-wide (the `rdma-emu` command's `port` and `event`). They belong to the fabric's layer:
//! the device itself knows nothing of other processes.

use crate::wire::Control;
use crate::{error::Result, objects::device::Device};

impl Device {
    /// [`set_port_state`](Device::set_port_state) in this process and in every other process
    /// on the same host fabric (joining it if needed), as one cable pull seen by all, and in
    /// every process that joins the fabric later (until the port is set up again); how many
    /// other processes were reached.
    pub fn set_port_state_host_wide(&self, port: u8, state: crate::PortState) -> Result<usize> {
        // Joined first: a join takes the ports the fabric records down, which would undo
        // an `up` set here before it.
        let node = self.fabric.joined()?;
        self.set_port_state(port, state)?;
        let Some(node) = node else { return Ok(0) };
        let (dev, up) = (self.inner.id.index, state == crate::PortState::ACTIVE);
        node.record_port(dev, port, up).map_err(|e| {
            let errno = e.raw_os_error().map_or(crate::Errno::EIO, crate::Errno);
            crate::Error::new(errno, "cannot record the port's state in the host fabric")
        })?;
        Ok(node.broadcast(Control::PortState { dev, port, up }))
    }

    /// [`raise_event`](Device::raise_event) in this process and in every other process on the
    /// same host fabric (joining it if needed); how many other processes were reached.
    pub fn raise_event_host_wide(
        &self,
        event_type: crate::EventType,
        port: Option<u8>,
    ) -> Result<usize> {
        self.raise_event(event_type, port)?;
        let (dev, port) = (self.inner.id.index, port.unwrap_or(0));
        self.broadcast(Control::Event { dev, port, event: event_type.0 })
    }

    fn broadcast(&self, c: Control) -> Result<usize> {
        Ok(self.fabric.joined()?.map_or(0, |node| node.broadcast(c)))
    }
}
