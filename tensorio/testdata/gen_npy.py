# Generates the .npy fixtures in this directory with real NumPy.
#
#   apt-get install -y python3-numpy   # Debian 12: NumPy 1.24.2
#   cd tensorio/testdata && /usr/bin/python3 gen_npy.py
#
# The files were generated with NumPy 1.24.2 (Python 3.11). NumPy >= 1.23 adds
# GROWTH_AXIS_MAX_DIGITS spare spaces to the header; older versions do not, so
# they write shorter (but still valid) headers for some shapes.
import numpy as np
import numpy.lib.format as fmt

a23 = (np.arange(6, dtype='<f4') * 0.5 - 1.25).reshape(2, 3)

def save(name, arr):
    np.save(name, arr)  # np.save picks format 1.0 for all of these

def write(name, arr, version):
    with open(name, 'wb') as f:
        fmt.write_array(f, arr, version=version)

# Files WriteNPY must reproduce byte for byte (float32, C order, version 1.0).
save('f4_2x3.npy', a23)
save('f4_0d.npy', np.array(3.5, dtype='<f4'))
save('f4_1d.npy', np.array([1, -2, 0.1, np.inf, -0.0], dtype='<f4'))
save('f4_0x3.npy', np.zeros((0, 3), dtype='<f4'))
save('f4_4d.npy', np.arange(24, dtype='<f4').reshape(2, 1, 3, 4) / 8)
# 14-d: the header lands exactly on a 64-byte boundary, so numpy pads it
# with a further 64 bytes (its padding is never empty).
save('f4_14d.npy', np.arange(100, dtype='<f4').reshape((1,) * 13 + (100,)))
save('f4_big_dim0.npy', np.zeros((123456789012, 0), dtype='<f4'))

# float64 (rounded to float32 on reading) and float16.
save('f8_1d.npy', np.array([0.1, -2.5, 1e300, 1e-50, 3.0000001192092896], dtype='<f8'))
save('f2_1d.npy', np.array([1, -2, 65504, 6e-8, np.inf], dtype='<f2'))

# Format versions 2.0 and 3.0 (4-byte header length; 3.0 is utf-8).
write('f4_2x3_v2.npy', a23, (2, 0))
write('f4_2x3_v3.npy', a23, (3, 0))
write('f8_2x3_v3.npy', a23.astype('<f8'), (3, 0))

# Files ReadNPY must reject.
save('f4_fortran.npy', np.asfortranarray(a23))
save('f4_bigendian.npy', a23.astype('>f4'))
save('i4_1d.npy', np.arange(3, dtype='<i4'))
