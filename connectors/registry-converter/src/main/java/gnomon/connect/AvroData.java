package gnomon.connect;

import java.nio.ByteBuffer;
import java.util.ArrayList;
import java.util.Collection;
import java.util.Date;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import org.apache.avro.LogicalType;
import org.apache.avro.LogicalTypes;
import org.apache.avro.generic.GenericEnumSymbol;
import org.apache.avro.generic.GenericFixed;
import org.apache.avro.generic.GenericRecord;
import org.apache.kafka.connect.data.Field;
import org.apache.kafka.connect.data.Schema;
import org.apache.kafka.connect.data.SchemaBuilder;
import org.apache.kafka.connect.data.Struct;
import org.apache.kafka.connect.data.Timestamp;
import org.apache.kafka.connect.errors.DataException;

/**
 * Avro schemas and values to Connect's: records become structs (named by the record's full
 * name), {@code ["null", T]} an optional T (default null), enums strings, {@code
 * timestamp-millis} longs Connect Timestamps, arrays and maps of those. Other unions, and
 * fixed or decimal types, are refused with a DataException naming the field: gnomon's export
 * schemas do not use them.
 */
final class AvroData {
    private final Map<org.apache.avro.Schema, Schema> schemas = new ConcurrentHashMap<>();

    Schema connectSchema(org.apache.avro.Schema avro) {
        return schemas.computeIfAbsent(avro, a -> toConnect(a, false, a.getFullName()));
    }

    private static Schema toConnect(org.apache.avro.Schema avro, boolean optional, String where) {
        SchemaBuilder b;
        LogicalType logical = avro.getLogicalType();
        switch (avro.getType()) {
            case RECORD:
                b = SchemaBuilder.struct().name(avro.getFullName());
                if (avro.getDoc() != null) {
                    b.doc(avro.getDoc());
                }
                for (org.apache.avro.Schema.Field f : avro.getFields()) {
                    b.field(f.name(), toConnect(f.schema(), false, where + "." + f.name()));
                }
                break;
            case UNION: {
                List<org.apache.avro.Schema> branches = avro.getTypes();
                if (branches.size() == 2 && branches.get(0).getType() == org.apache.avro.Schema.Type.NULL) {
                    return toConnect(branches.get(1), true, where);
                }
                if (branches.size() == 2 && branches.get(1).getType() == org.apache.avro.Schema.Type.NULL) {
                    return toConnect(branches.get(0), true, where);
                }
                throw new DataException(where + ": union " + avro + " is not [\"null\", T]; not supported");
            }
            case ENUM:
            case STRING:
                b = SchemaBuilder.string();
                break;
            case LONG:
                b = logical instanceof LogicalTypes.TimestampMillis ? Timestamp.builder() : SchemaBuilder.int64();
                break;
            case INT:
                b = SchemaBuilder.int32();
                break;
            case BOOLEAN:
                b = SchemaBuilder.bool();
                break;
            case DOUBLE:
                b = SchemaBuilder.float64();
                break;
            case FLOAT:
                b = SchemaBuilder.float32();
                break;
            case BYTES:
                if (logical != null) {
                    throw new DataException(where + ": logical type " + logical.getName() + " not supported");
                }
                b = SchemaBuilder.bytes();
                break;
            case ARRAY:
                b = SchemaBuilder.array(toConnect(avro.getElementType(), false, where + "[]"));
                break;
            case MAP:
                b = SchemaBuilder.map(Schema.STRING_SCHEMA, toConnect(avro.getValueType(), false, where + "{}"));
                break;
            default:
                throw new DataException(where + ": Avro type " + avro.getType() + " not supported");
        }
        if (optional) {
            b.optional().defaultValue(null);
        }
        return b.build();
    }

    /** {@code value} (read with {@code avro}) as a value of {@code schema} (its connectSchema). */
    Object toConnectValue(Schema schema, Object value) {
        if (value == null) {
            return null;
        }
        switch (schema.type()) {
            case STRUCT: {
                GenericRecord record = (GenericRecord) value;
                Struct struct = new Struct(schema);
                for (Field f : schema.fields()) {
                    struct.put(f, toConnectValue(f.schema(), record.get(f.name())));
                }
                return struct;
            }
            case STRING:
                if (value instanceof GenericEnumSymbol || value instanceof CharSequence) {
                    return value.toString();
                }
                break;
            case INT64:
                if (Timestamp.LOGICAL_NAME.equals(schema.name())) {
                    return value instanceof java.time.Instant i ? Date.from(i) : new Date(((Number) value).longValue());
                }
                return ((Number) value).longValue();
            case INT32:
                return ((Number) value).intValue();
            case FLOAT64:
                return ((Number) value).doubleValue();
            case FLOAT32:
                return ((Number) value).floatValue();
            case BOOLEAN:
                return value;
            case BYTES:
                if (value instanceof ByteBuffer buf) {
                    byte[] out = new byte[buf.remaining()];
                    buf.duplicate().get(out);
                    return out;
                }
                if (value instanceof GenericFixed fixed) {
                    return fixed.bytes();
                }
                break;
            case ARRAY: {
                List<Object> out = new ArrayList<>();
                for (Object item : (Collection<?>) value) {
                    out.add(toConnectValue(schema.valueSchema(), item));
                }
                return out;
            }
            case MAP: {
                Map<String, Object> out = new LinkedHashMap<>();
                for (Map.Entry<?, ?> e : ((Map<?, ?>) value).entrySet()) {
                    out.put(e.getKey().toString(), toConnectValue(schema.valueSchema(), e.getValue()));
                }
                return out;
            }
            default:
                break;
        }
        throw new DataException("cannot convert " + value.getClass().getName() + " to " + schema.type());
    }
}
