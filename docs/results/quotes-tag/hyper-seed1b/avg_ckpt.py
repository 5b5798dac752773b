"""Average hypernetwork checkpoints (hypernet.safetensors, F32 tensors) element-wise.
usage: avg_ckpt.py OUT_DIR DIR1 DIR2 ...  (hypernet.json copied from DIR1)"""
import json, struct, sys, shutil, os
import numpy as np
out, dirs = sys.argv[1], sys.argv[2:]
def load(d):
    b = open(os.path.join(d, 'hypernet.safetensors'), 'rb').read()
    n = struct.unpack('<Q', b[:8])[0]
    h = json.loads(b[8:8 + n])
    return h, b[8 + n:]
heads = [load(d) for d in dirs]
h0, _ = heads[0]
meta = h0.pop('__metadata__', None)
blob = bytearray(heads[0][1])
for name, info in h0.items():
    assert info['dtype'] == 'F32', (name, info['dtype'])
    a, z = info['data_offsets']
    acc = np.zeros((z - a) // 4, dtype=np.float64)
    for h, data in heads:
        ha, hz = h[name]['data_offsets']
        acc += np.frombuffer(data[ha:hz], dtype='<f4')
    blob[a:z] = (acc / len(heads)).astype('<f4').tobytes()
if meta is not None:
    h0['__metadata__'] = meta
hb = json.dumps(h0).encode()
hb += b' ' * ((8 - len(hb) % 8) % 8)
os.makedirs(out, exist_ok=True)
with open(os.path.join(out, 'hypernet.safetensors'), 'wb') as f:
    f.write(struct.pack('<Q', len(hb))); f.write(hb); f.write(blob)
shutil.copy(os.path.join(dirs[0], 'hypernet.json'), out)
print('averaged', len(dirs), 'checkpoints,', len(h0) - (meta is not None), 'tensors ->', out)
