// The microphone tap of the Talk page: hands each render quantum (mono, at the context's
// 24 kHz) to the page, which batches it into 100 ms PCM16 appends.
class Tap extends AudioWorkletProcessor {
  process(inputs) {
    const channel = inputs[0]?.[0];
    if (channel) this.port.postMessage(channel.slice(0));
    return true;
  }
}

registerProcessor("omniqueue-tap", Tap);
