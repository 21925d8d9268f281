"""Variables made under no strategy, OneDeviceStrategy and MirroredStrategy in turn (as the
distributed training guide goes through them), some dropped before the end."""

import keras
import tensorflow as tf

plain = tf.Variable(1.0, name="plain")
with tf.device("/GPU:1"):
    pinned = tf.Variable(2.0, name="pinned")
temp = tf.Variable(3.0, name="temp")
del temp

one = tf.distribute.OneDeviceStrategy("/GPU:1")
with one.scope():
    m1 = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="d1")], name="one")
    m1.compile(optimizer="sgd", loss="mse")
    once = tf.Variable(5.0, name="once")
del once
m1.fit(tf.zeros((8, 4)), tf.zeros((8, 2)), epochs=1, verbose=0)

mirrored = tf.distribute.MirroredStrategy()
with mirrored.scope():
    scratch = tf.Variable(4.0, name="scratch")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="d2")], name="two")
    model.compile(optimizer="sgd", loss="mse")
del scratch
model.fit(tf.zeros((8, 4)), tf.zeros((8, 2)), epochs=1, verbose=0)
